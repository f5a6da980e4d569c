"""``text2sql``: answer a question about a generated sqlite database with a SQL query, over several turns.

Each turn the agent writes either ``<sql>QUERY</sql>`` (the environment runs it and returns the rows or
the error) or ``<answer>QUERY</answer>`` (the final answer; the episode ends). The outcome is 1 when the
final query's result set equals the reference query's (as a multiset of rows, or as a list when the
question asks for an order), else 0; it is returned as the final reward and in ``info`` but never in
the text the agent sees. An optional ``<reflect>solved|unsolved</reflect>`` after the answer (or, with
``reflect="turn"``, in one extra turn) is parsed into ``info["reflection"]``.

Queries run in-process on a private in-memory copy of the database, read-only, through an authorizer
that admits only reads, with a wall-time limit (progress handler) and caps on rows and value sizes;
see docs/tasks.md for why this is safe without the code sandbox.
"""

from __future__ import annotations

import math
import random
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import ConfigError
from .base import Problem, check_split, parse_reflection, parse_tagged_turn, register_task, stable_hash

SCHEMA = {
    "departments": ("id", "name", "city"),
    "employees": ("id", "name", "dept_id", "salary", "age"),
    "sales": ("id", "emp_id", "amount", "year"),
}
_DDL = """CREATE TABLE departments (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL);
CREATE TABLE employees (id INTEGER PRIMARY KEY, name TEXT NOT NULL, dept_id INTEGER NOT NULL REFERENCES departments(id),
  salary INTEGER NOT NULL, age INTEGER NOT NULL);
CREATE TABLE sales (id INTEGER PRIMARY KEY, emp_id INTEGER NOT NULL REFERENCES employees(id), amount INTEGER NOT NULL,
  year INTEGER NOT NULL);
"""
DEPARTMENTS = ("Sales", "Research", "Support", "Legal", "Finance", "Design", "Ops", "Marketing")
CITIES = ("Paris", "Lima", "Oslo", "Cairo", "Tokyo", "Boston", "Rome", "Delhi")
NAMES = ("Ada", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gia", "Hugo", "Ivy", "Jon", "Kai", "Lea", "Max", "Nia", "Omar",
         "Pia", "Quin", "Rosa", "Sam", "Tess", "Uma", "Vic", "Wes", "Xena", "Yann", "Zoe", "Alma", "Bo", "Cruz", "Dina")
YEARS = (2021, 2022, 2023, 2024)

QUERY_TIMEOUT_S = 1.0
ROW_CAP = 1000  # rows fetched at most; a result with more rows never matches (references are small)
RESULT_BYTES_CAP = 1 << 20
VALUE_LENGTH_CAP = 10_000  # largest string/blob sqlite may build (SQLITE_LIMIT_LENGTH)
SQL_LENGTH_CAP = 4000
SHOW_ROWS = 10  # rows shown to the agent per query
SHOW_CELL = 40  # characters shown per value

_READ_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
# Functions a query may call. sqlite checks its time limit only between VM steps, so a function that can
# spend long inside one call (printf's repeat width, extension loaders) is left out; values are capped anyway.
_ALLOWED_FUNCTIONS = frozenset("""
count sum avg min max total group_concat string_agg
abs coalesce ifnull iif nullif instr length lower upper ltrim rtrim trim replace round substr substring typeof
like glob cast date time datetime julianday strftime unixepoch ceil ceiling floor sqrt pow power mod sign
row_number rank dense_rank ntile lag lead first_value last_value nth_value percent_rank cume_dist
""".split())
_LEADING = re.compile(r"\A(?:\s|--[^\n]*(?:\n|\Z)|/\*.*?\*/)*", re.DOTALL)
_FIRST_WORD = re.compile(r"[A-Za-z]+")
_TAG = re.compile(r"<(sql|answer)>", re.IGNORECASE)
_SQL_FENCE = re.compile(r"```[ \t]*(?:sql|sqlite)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_BARE_QUERY = re.compile(r"(?:SELECT|WITH)\s", re.IGNORECASE)
INSTRUCTIONS = ("Run a query with <sql>...</sql>; give the final query as <answer>...</answer>.")
REFLECT_INLINE = " Then add <reflect>solved</reflect> or <reflect>unsolved</reflect>."
REFLECT_QUESTION = "\nreflect: solved or unsolved?\n"
CHAT_INSTRUCTIONS = ("Answer the question about a SQLite database with one SQL query: reply with the query whose "
                     "result answers it, in a ```sql code block. To run a query first and see its result, write "
                     "<sql>QUERY</sql>.")
CHAT_REFLECT_INLINE = " After the answer, write <reflect>solved</reflect> or <reflect>unsolved</reflect>."


# ------------------------------------------------------------------------------------------------
# Databases.
# ------------------------------------------------------------------------------------------------
@lru_cache(maxsize=256)
def database_script(db_seed: str) -> str:
    """The SQL script (schema and rows) of the database generated from ``db_seed``; deterministic."""
    rng = random.Random(stable_hash("text2sql/db/" + db_seed))
    depts = rng.sample(DEPARTMENTS, rng.randint(3, 5))
    rows = [f"INSERT INTO departments VALUES ({i}, '{name}', '{rng.choice(CITIES)}');"
            for i, name in enumerate(depts, 1)]
    names = rng.sample(NAMES, rng.randint(8, 14))
    dept_of = list(range(1, len(depts) + 1)) + [rng.randint(1, len(depts)) for _ in names[len(depts):]]
    rng.shuffle(dept_of)
    for i, name in enumerate(names, 1):
        rows.append(f"INSERT INTO employees VALUES ({i}, '{name}', {dept_of[i - 1]}, {rng.randint(30, 120) * 1000}, "
                    f"{rng.randint(22, 64)});")
    for i in range(1, rng.randint(15, 30) + 1):
        rows.append(f"INSERT INTO sales VALUES ({i}, {rng.randint(1, len(names))}, {rng.randint(1, 50) * 10}, "
                    f"{rng.choice(YEARS)});")
    return _DDL + "\n".join(rows) + "\n"


def _authorize(action: int, arg1: Any, arg2: Any, db: Any, trigger: Any) -> int:
    """sqlite authorizer: reads and the allowed functions only; everything else is denied at prepare time."""
    if action not in _READ_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() not in _ALLOWED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


class Database:
    """A private, read-only, in-memory copy of one generated database with a guarded query runner."""

    def __init__(self, db_seed: str, timeout_s: float = QUERY_TIMEOUT_S):
        self.timeout_s, self._deadline = timeout_s, math.inf
        self.conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self.conn.executescript(database_script(db_seed))
        self.conn.execute("PRAGMA query_only = ON")
        for name, value in (("SQLITE_LIMIT_ATTACHED", 0), ("SQLITE_LIMIT_LENGTH", VALUE_LENGTH_CAP),
                            ("SQLITE_LIMIT_SQL_LENGTH", SQL_LENGTH_CAP), ("SQLITE_LIMIT_COLUMN", 64),
                            ("SQLITE_LIMIT_LIKE_PATTERN_LENGTH", 100)):
            if hasattr(self.conn, "setlimit") and hasattr(sqlite3, name):  # Python >= 3.11
                self.conn.setlimit(getattr(sqlite3, name), value)
        self.conn.set_authorizer(_authorize)
        self.conn.set_progress_handler(self._expired, 1000)

    def _expired(self) -> int:
        return 1 if time.monotonic() > self._deadline else 0

    def run(self, sql: str) -> tuple[list[str], list[tuple], str | None]:
        """(column names, rows, error text or None); never raises. Rows stop at ROW_CAP + 1; results over 1 MiB fail."""
        if not isinstance(sql, str) or not sql.strip():
            return [], [], "empty query"
        if len(sql) > SQL_LENGTH_CAP:
            return [], [], f"query longer than {SQL_LENGTH_CAP} characters"
        lead = _FIRST_WORD.match(sql, _LEADING.match(sql).end())
        if lead is None or lead.group().upper() not in ("SELECT", "WITH", "VALUES"):
            return [], [], "only SELECT queries are allowed"
        rows: list[tuple] = []
        self._deadline = time.monotonic() + self.timeout_s
        try:
            cur = self.conn.execute(sql)
            cols = [d[0] for d in cur.description or ()]
            size = 0
            for row in cur:
                rows.append(row)
                size += sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in row)
                if size > RESULT_BYTES_CAP:
                    cur.close()
                    return [], [], f"result larger than {RESULT_BYTES_CAP >> 20} MiB"
                if len(rows) > ROW_CAP:
                    break
            cur.close()
            return cols, rows, None
        except sqlite3.OperationalError as exc:
            text = "query took too long" if "interrupt" in str(exc).lower() else str(exc)
            return [], [], text
        except (sqlite3.Error, ValueError, OverflowError, MemoryError, UnicodeError) as exc:
            return [], [], str(exc) or type(exc).__name__
        finally:
            self._deadline = math.inf

    def close(self) -> None:
        self.conn.close()


def normalize(value: Any) -> Any:
    """A comparable form of one result value: floats rounded to 6 decimals, integral floats as ints."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return repr(value)
        value = round(value, 6)
        return int(value) if value.is_integer() else value
    return value


def same_result(got: Sequence[tuple], want: Sequence[tuple], ordered: bool) -> bool:
    """Whether two result sets are equal: as lists when ``ordered``, else as multisets of rows."""
    if len(got) != len(want):
        return False
    a = [tuple(normalize(v) for v in row) for row in got]
    b = [tuple(normalize(v) for v in row) for row in want]
    return a == b if ordered else Counter(a) == Counter(b)


def render(cols: list[str], rows: list[tuple], error: str | None) -> str:
    """The feedback text for one executed query: ``rows: N``, the column names, then up to SHOW_ROWS rows."""
    if error is not None:
        return f"\nerror: {error[:200]}\n"
    more = len(rows) > ROW_CAP
    head = f"rows: {'more than ' + str(ROW_CAP) if more else len(rows)}"
    cell = lambda v: "NULL" if v is None else str(normalize(v))[:SHOW_CELL]
    lines = [head, "|".join(c[:SHOW_CELL] for c in cols)] + ["|".join(cell(v) for v in r) for r in rows[:SHOW_ROWS]]
    if len(rows) > SHOW_ROWS:
        lines.append(f"... {'more' if more else len(rows) - SHOW_ROWS} more")
    return "\n" + "\n".join(lines) + "\n"


def parse_turn(text: Any) -> tuple[str | None, str]:
    """(kind, query) of an agent turn: kind 'sql' or 'answer' from the first opening tag, or None.

    The query runs from that tag to its closing tag, or to the end of the text when the closing
    tag is missing (a generator that stops at the closing tag may have dropped it). A turn without a tag that
    holds a fenced ```sql block, or that is itself a SELECT query, is an answer with that query (how a general
    instruct model writes SQL).
    """
    kind, query = parse_tagged_turn(text, _TAG)
    if kind is None and isinstance(text, str):
        fenced = _SQL_FENCE.search(text[:SQL_LENGTH_CAP * 2])
        if fenced is not None:
            return "answer", fenced.group(1).strip()
        bare = text.strip()
        if _BARE_QUERY.match(bare):
            return "answer", bare
    return kind, query


# ------------------------------------------------------------------------------------------------
# Questions.
# ------------------------------------------------------------------------------------------------
_JOIN = "FROM employees e JOIN departments d ON e.dept_id = d.id"


@dataclass(frozen=True)
class Template:
    """A question with slots, its reference SQL, how to pick slot values from a database, and a validity check."""

    name: str
    question: str
    sql: str
    slots: Callable[[sqlite3.Connection], list[dict]] = lambda conn: [{}]
    ordered: bool = False
    check: str | None = None  # SQL returning 1 when the question has one well-defined answer


def _values(sql: str, key: str) -> Callable[[sqlite3.Connection], list[dict]]:
    return lambda conn: [{key: v} for v in sorted(r[0] for r in conn.execute(sql).fetchall())]


TEMPLATES: tuple[Template, ...] = (
    Template("count_all", "How many employees are there?", "SELECT COUNT(*) FROM employees"),
    Template("count_older", "How many employees are older than {age}?",
             "SELECT COUNT(*) FROM employees WHERE age > {age}",
             _values("SELECT DISTINCT age FROM employees WHERE age < (SELECT MAX(age) FROM employees)", "age")),
    Template("names_older", "List the names of employees older than {age}.",
             "SELECT name FROM employees WHERE age > {age}",
             _values("SELECT DISTINCT age FROM employees WHERE age < (SELECT MAX(age) FROM employees)", "age")),
    Template("names_in_dept", "List the names of employees in {dept}.",
             f"SELECT e.name {_JOIN} WHERE d.name = '{{dept}}'", _values("SELECT name FROM departments", "dept")),
    Template("count_in_dept", "How many employees work in {dept}?",
             f"SELECT COUNT(*) {_JOIN} WHERE d.name = '{{dept}}'", _values("SELECT name FROM departments", "dept")),
    Template("avg_salary_dept", "What is the average salary in {dept}?",
             f"SELECT AVG(e.salary) {_JOIN} WHERE d.name = '{{dept}}'",
             _values("SELECT name FROM departments", "dept")),
    Template("max_salary", "What is the highest salary?", "SELECT MAX(salary) FROM employees"),
    Template("top_earner", "Who earns the most?", "SELECT name FROM employees ORDER BY salary DESC LIMIT 1",
             check="SELECT COUNT(*) = 1 FROM employees WHERE salary = (SELECT MAX(salary) FROM employees)"),
    Template("rich_sorted", "List the names of employees earning more than {salary}, highest salary first.",
             "SELECT name FROM employees WHERE salary > {salary} ORDER BY salary DESC",
             _values("SELECT DISTINCT salary FROM employees WHERE salary < (SELECT MAX(salary) FROM employees)",
                     "salary"), ordered=True,
             check="SELECT COUNT(*) = COUNT(DISTINCT salary) FROM employees WHERE salary > {salary}"),
    Template("depts_in_city", "Which departments are in {city}?", "SELECT name FROM departments WHERE city = '{city}'",
             _values("SELECT DISTINCT city FROM departments", "city")),
    Template("sales_in_year", "What was the total sales amount in {year}?",
             "SELECT SUM(amount) FROM sales WHERE year = {year}", _values("SELECT DISTINCT year FROM sales", "year")),
    Template("sales_of_emp", "What is the total sales amount of {emp}?",
             "SELECT SUM(s.amount) FROM sales s JOIN employees e ON s.emp_id = e.id WHERE e.name = '{emp}'",
             _values("SELECT DISTINCT e.name FROM sales s JOIN employees e ON s.emp_id = e.id", "emp")),
    Template("count_per_dept", "How many employees does each department have?",
             f"SELECT d.name, COUNT(*) {_JOIN} GROUP BY d.name"),
    Template("no_sales", "Which employees made no sales?",
             "SELECT name FROM employees WHERE id NOT IN (SELECT emp_id FROM sales)"),
    Template("biggest_dept", "Which department has the most employees?",
             f"SELECT d.name {_JOIN} GROUP BY d.name ORDER BY COUNT(*) DESC LIMIT 1",
             check="SELECT COUNT(*) = 1 FROM (SELECT COUNT(*) AS n FROM employees GROUP BY dept_id) "
                   "WHERE n = (SELECT MAX(n) FROM (SELECT COUNT(*) AS n FROM employees GROUP BY dept_id))"),
    Template("city_of_emp", "In which city does {emp} work?", f"SELECT d.city {_JOIN} WHERE e.name = '{{emp}}'",
             _values("SELECT name FROM employees", "emp")),
)
TEMPLATE_BY_NAME = {t.name: t for t in TEMPLATES}


def schema_line() -> str:
    """``tables: departments(id, name, city); employees(...); sales(...)``."""
    return "tables: " + "; ".join(f"{t}({', '.join(cols)})" for t, cols in SCHEMA.items())


@register_task("text2sql")
class Text2SQLTask:
    """Templated questions over generated databases; held-out questions are asked about unseen databases."""

    name = "text2sql"
    multi_turn = True
    tool_kinds = ("sql",)  # the env infos' "kind" of a turn that used a tool (ran a query)
    stop_sequences = ("</sql>", "</answer>")
    max_new_tokens = 100  # one turn: <answer>SELECT ... </answer> is up to ~90 characters (tokens of a tiny model)
    chat_max_new_tokens = 96  # a chat model's turn (BPE tokens): some words and a tagged query

    def __init__(self, n_train_dbs: int = 24, n_heldout_dbs: int = 6, per_template: int = 2, max_turns: int = 6,
                 reflect: str = "off", instructions: bool = True, schema: bool = True,
                 templates: Sequence[str] | str | None = None, seed: int = 0, query_timeout_s: float = QUERY_TIMEOUT_S,
                 n_validation_dbs: int = 6):
        if reflect not in ("off", "inline", "turn"):
            raise ConfigError(f"text2sql reflect must be off, inline or turn, got {reflect!r}")
        if not (isinstance(max_turns, int) and max_turns >= 1):
            raise ConfigError(f"text2sql max_turns must be a positive integer, got {max_turns!r}")
        if min(n_train_dbs, n_heldout_dbs, n_validation_dbs) < 1 or per_template < 1:
            raise ConfigError("text2sql n_train_dbs, n_validation_dbs, n_heldout_dbs and per_template must be at "
                              "least 1")
        if not query_timeout_s > 0:
            raise ConfigError(f"text2sql query_timeout_s must be positive, got {query_timeout_s!r}")
        names = templates.split(",") if isinstance(templates, str) else list(templates or TEMPLATE_BY_NAME)
        unknown = [n for n in names if n not in TEMPLATE_BY_NAME]
        if unknown or not names:
            raise ConfigError(f"unknown text2sql templates {unknown or names}; "
                              f"available: {', '.join(TEMPLATE_BY_NAME)}")
        self.templates = [TEMPLATE_BY_NAME[n] for n in names]
        self.n_dbs = {"train": n_train_dbs, "validation": n_validation_dbs, "heldout": n_heldout_dbs}
        self.per_template, self.max_turns, self.reflect = per_template, max_turns, reflect
        self.instructions, self.schema, self.seed, self.query_timeout_s = instructions, schema, seed, query_timeout_s
        if reflect == "inline":
            self.stop_sequences = ("</sql>", "</reflect>")
        self._cache: dict[str, list[Problem]] = {}

    # ------------------------------------------------------------------ problems
    def _prompt(self, question: str) -> str:
        lines = []
        if self.instructions:
            lines.append(INSTRUCTIONS + (REFLECT_INLINE if self.reflect == "inline" else ""))
        if self.schema:
            lines.append(schema_line())
        lines.append(f"question: {question}")
        return "\n".join(lines) + "\n"

    def chat_prompt(self, problem: Problem) -> str:
        """The first message to a chat model: the turn protocol, the tables and the question."""
        parts = []
        if self.instructions:
            parts.append(CHAT_INSTRUCTIONS + (CHAT_REFLECT_INLINE if self.reflect == "inline" else ""))
        if self.schema:
            parts.append("Tables: " + "; ".join(f"{t}({', '.join(cols)})" for t, cols in SCHEMA.items()))
        parts.append(f"Question: {problem.meta['question']}")
        return "\n\n".join(parts)

    def _db_problems(self, split: str, index: int) -> list[Problem]:
        db_id, db_seed = f"{split}-{index}", f"{self.seed}/{split}/{index}"
        db = Database(db_seed)
        rng = random.Random(stable_hash(f"text2sql/questions/{db_seed}"))
        out = []
        try:
            for tpl in self.templates:
                options = tpl.slots(db.conn)
                rng.shuffle(options)
                kept = 0
                for slots in options:
                    if kept == self.per_template:
                        break
                    sql = tpl.sql.format(**slots)
                    if tpl.check and db.conn.execute(tpl.check.format(**slots)).fetchone()[0] != 1:
                        continue
                    _, rows, err = db.run(sql)
                    if err is not None or not rows or rows[0][0] is None:
                        continue
                    key = ",".join(f"{k}={v}" for k, v in slots.items())
                    out.append(Problem(
                        id=f"text2sql:{db_id}:{tpl.name}" + (f":{key}" if key else ""),
                        prompt=self._prompt(tpl.question.format(**slots)), answer=sql,
                        meta={"db": db_id, "db_seed": db_seed, "sql": sql, "ordered": tpl.ordered,
                              "template": tpl.name, "question": tpl.question.format(**slots)}))
                    kept += 1
        finally:
            db.close()
        return out

    def problems(self, split: str) -> list[Problem]:
        """The problems of ``split``: each split has databases of its own, so the splits are disjoint."""
        check_split(split)
        if split not in self._cache:
            self._cache[split] = [p for i in range(self.n_dbs[split]) for p in self._db_problems(split, i)]
        return list(self._cache[split])

    # ------------------------------------------------------------------ verifier
    def outcome(self, problem: Problem, sql: str, db: Database | None = None) -> tuple[float, str | None]:
        """(1.0 or 0.0, error text) for a final query: does its result set equal the reference's?"""
        own = db is None
        db = db or Database(problem.meta["db_seed"], self.query_timeout_s)
        try:
            _, got, err = db.run(sql)
            if err is not None:
                return 0.0, err
            _, want, ref_err = db.run(problem.meta["sql"])
            if ref_err is not None:  # pragma: no cover - references are checked when problems are built
                raise RuntimeError(f"reference query of {problem.id} fails: {ref_err}")
            ok = len(got) <= ROW_CAP and same_result(got, want, problem.meta["ordered"])
            return (1.0 if ok else 0.0), None
        finally:
            if own:
                db.close()

    def score(self, problem: Problem, completion: Any) -> float:
        """Outcome of the completion's first ``<answer>QUERY</answer>`` (0.0 without one); never raises on junk."""
        if not isinstance(completion, str):
            return 0.0
        start = re.search(r"<answer>", completion, re.IGNORECASE)
        kind, sql = parse_turn(completion[start.start():]) if start else (None, "")
        return self.outcome(problem, sql)[0] if kind == "answer" else 0.0

    def score_many(self, problems: Sequence[Problem], completions: Sequence[Any]) -> list[float]:
        """``score`` for each pair."""
        return [self.score(p, c) for p, c in zip(problems, completions)]

    def demonstration(self, problem: Problem) -> str:
        """The single-turn target: the reference query as the final answer."""
        return f"<answer>{problem.meta['sql']}</answer>"

    def demonstration_turns(self, problem: Problem) -> list[tuple[str, str]]:
        """A multi-turn target: (agent turn, environment reply) pairs: run the reference, then answer with it."""
        env = self.make_env(max_turns=max(2, self.max_turns))
        env.reset(problem)
        query = f"<sql>{problem.meta['sql']}</sql>"
        feedback = env.step(query)[0]
        env.close()
        return [(query, feedback), (self.demonstration(problem), "")]

    def teacher_prompt(self, problem: Problem) -> str:
        """The prompt with the reference query in context, for a self-teacher."""
        return f"reference: {problem.meta['sql']}\n{problem.prompt}"

    def make_env(self, max_turns: int | None = None) -> SQLEnv:
        """A multi-turn environment (``max_turns`` agent turns, default the task's)."""
        return SQLEnv(self, max_turns or self.max_turns)


class SQLEnv:
    """The text2sql turn protocol over one problem (see the module docstring and docs/tasks.md)."""

    def __init__(self, task: Text2SQLTask, max_turns: int):
        self.task, self.max_turns = task, max_turns
        self.problem: Problem | None = None
        self.db: Database | None = None
        self.turns, self.done, self._final = 0, True, None

    def reset(self, problem: Problem) -> str:
        """Open a fresh copy of the problem's database; return the prompt."""
        self.close()
        self.problem, self.turns, self.done, self._final = problem, 0, False, None
        self.db = Database(problem.meta["db_seed"], self.task.query_timeout_s)
        return problem.prompt

    def step(self, text: str) -> tuple[str, float, bool, dict[str, Any]]:
        """One agent turn -> (feedback text, reward, done, info); the reward is the outcome, at the end only."""
        if self.done or self.problem is None:
            raise RuntimeError("step() called on a finished episode; call reset(problem) first")
        if self._final is not None:  # the extra reflection turn (reflect="turn")
            info = dict(self._final)
            info["reflection"] = _reflection_word(text)
            return self._finish(info)
        self.turns += 1
        kind, sql = parse_turn(text)
        if kind == "answer":
            outcome, error = self.task.outcome(self.problem, sql, self.db)
            info = {"outcome": outcome, "turns": self.turns, "answered": True, "answer_sql": sql}
            if error is not None:
                info["error"] = error
            if self.task.reflect == "turn":
                self._final = info
                return REFLECT_QUESTION, 0.0, False, {"kind": "answer", "turns": self.turns}
            reflection = parse_reflection(text) if isinstance(text, str) else None
            if reflection is not None:
                info["reflection"] = reflection
            return self._finish(info)
        if kind == "sql":
            cols, rows, error = self.db.run(sql)
            feedback, step_info = render(cols, rows, error), {"kind": "sql", "error": error is not None}
        else:
            feedback = "\nerror: write <sql>QUERY</sql> to run a query or <answer>QUERY</answer> to answer\n"
            step_info = {"kind": "invalid", "error": True}
        if self.turns >= self.max_turns:
            return self._finish({"outcome": 0.0, "turns": self.turns, "answered": False, "truncated": True})
        return feedback, 0.0, False, {**step_info, "turns": self.turns}

    def _finish(self, info: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        self.done = True
        self.close()
        return "", float(info["outcome"]), True, info

    def close(self) -> None:
        """Release the database copy."""
        if self.db is not None:
            self.db.close()
            self.db = None


def _reflection_word(text: Any) -> int | None:
    """A reflection turn: ``<reflect>solved|unsolved</reflect>`` or the bare word ``solved`` / ``unsolved``."""
    if not isinstance(text, str):
        return None
    tagged = parse_reflection(text)
    if tagged is not None:
        return tagged
    word = re.match(r"\s*([A-Za-z]+)", text[:64])
    return {"solved": 1, "unsolved": 0}.get(word.group(1).lower()) if word else None
