"""The one discounted sum: every kernel against a plain-Python reference, with episode ends and bootstrap."""

import pytest
import torch

from reflectrl.core import RingBuffer, discounted_cumsum, discounted_returns, gae, returns_to_go


def reference(x, end, d, boot):
    out = []
    for r in range(len(x)):
        run, row = (boot[r] if boot is not None else 0.0), []
        for t in range(len(x[r]) - 1, -1, -1):
            run = x[r][t] + d * (0.0 if end[r][t] else 1.0) * run
            row.append(run)
        out.append(row[::-1])
    return out


@pytest.mark.parametrize("kernel", ["auto", "loop", "matmul"])
@pytest.mark.parametrize("with_boot", [False, True])
def test_kernels_match_reference(kernel, with_boot):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 9, generator=g, dtype=torch.float64)
    end = torch.rand(5, 9, generator=g) < 0.25
    boot = torch.randn(5, generator=g, dtype=torch.float64) if with_boot else None
    got = discounted_cumsum(x, end, 0.9, boot, kernel=kernel)
    want = torch.tensor(reference(x.tolist(), end.tolist(), 0.9, None if boot is None else boot.tolist()),
                        dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_closed_kernel_without_ends_and_its_guard():
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    # 1 + .5 * (2 + .5 * (3 + .5 * 4)) = 1 + .5 * 4.5 = 3.25
    got = discounted_cumsum(x, None, 0.5, 4.0, kernel="closed")
    torch.testing.assert_close(got, torch.tensor([[3.25, 4.5, 5.0]], dtype=torch.float64))
    with pytest.raises(ValueError):
        discounted_cumsum(x, torch.tensor([[True, False, False]]), 0.5, kernel="closed")
    with pytest.raises(ValueError):
        discounted_cumsum(x, None, 0.5, kernel="fft")


def test_wrappers_are_the_same_sum():
    r = torch.tensor([[1.0, 0.0, 2.0, 1.0]])
    end = torch.tensor([[False, True, False, False]])
    assert torch.equal(discounted_returns(r, end, 0.5), discounted_cumsum(r, end, 0.5, kernel="loop"))
    # GAE with zero values and lambda 1 is the discounted return
    adv, _ = gae(r, torch.zeros_like(r), torch.zeros_like(r), end, end, 0.5, 1.0)
    torch.testing.assert_close(adv, discounted_returns(r, end, 0.5))
    assert returns_to_go(torch.tensor([]), 0.9).numel() == 0
    # extreme discounting falls back to the loop: gamma^L underflows the closed form
    long = torch.ones(2000)
    torch.testing.assert_close(returns_to_go(long, 0.5)[:3], torch.tensor([2.0, 2.0, 2.0]))


def test_ring_buffer_is_fifo_and_round_trips():
    buf = RingBuffer(3, {"x": ((2,), torch.float32), "k": ((), torch.long)})
    s = buf.add(x=torch.ones(2, 2), k=torch.tensor([1, 2]))
    assert s.tolist() == [0, 1] and buf.size == 2
    s = buf.add(x=torch.full((2, 2), 2.0), k=torch.tensor([3, 4]))
    assert s.tolist() == [2, 0] and buf.size == 3 and buf.k.tolist() == [4, 2, 3]
    s = buf.add(x=torch.zeros(5, 2), k=torch.arange(10, 15))  # more than fits: the last 3 are kept
    assert s.tolist() == [1, 2, 0] and buf.k.tolist() == [14, 12, 13] and buf.ptr == 1
    t, m = buf.state()
    other = RingBuffer(3, {"x": ((2,), torch.float32), "k": ((), torch.long)})
    other.load_state(t, m)
    assert torch.equal(other.view("k"), buf.view("k")) and other.ptr == buf.ptr
    with pytest.raises(ValueError):
        RingBuffer(0, {"x": ((), torch.float32)})
