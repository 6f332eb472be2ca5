"""Synthetic tasks of the reference DLM, with exact checkers and a held-out split.

Each task makes (prompt, answer) pairs from a seeded `random.Random` and checks any answer exactly. Answers run
over several blocks of 8 tokens and mix spans the model can be sure of (a copy, a sort, a count, a reversal of
what it already wrote) with spans that have several valid forms, whose tokens depend on each other. Revealing
many tokens of such a span in one step goes wrong (each position's argmax comes from its own marginal, so forms
get mixed); revealing the sure spans together is free. That is what makes lower thresholds buy parallelism and
cost accuracy, which is the trade-off MRP's modes act on:
- `sort`: the letters sorted, then in reverse order (one valid answer, every span sure);
- `perm`: a copy of the letters, any ordering of them, then that ordering reversed;
- `swap`: the four letter pairs of the prompt, each in either order (two forms per pair, 50/50 marginals),
  then what was written, reversed;
- `pair`: a copy of the tag, two digits whose sum is the given number, then the same sum with the digits swapped.

The held-out split is defined by the prompt: a prompt whose CRC32 is divisible by `HELD_OUT_MODULUS` is
held out, and the training sampler never emits it. Evaluation sets are drawn from held-out prompts only.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass

HELD_OUT_MODULUS = 10
#: the layout the reference model is trained on: prompts left-padded to PROMPT_LENGTH, answers (+ EOS fill)
#: of ANSWER_LENGTH tokens (three blocks of the model's 8: answers have at most 23 characters)
PROMPT_LENGTH = 16
ANSWER_LENGTH = 24

_LETTERS = "abcdefghijkl"


def is_held_out(prompt: str) -> bool:
    return zlib.crc32(prompt.encode()) % HELD_OUT_MODULUS == 0


def _distinct(rng: random.Random, count: int) -> list[str]:
    return rng.sample(_LETTERS, count)


def _argument(prompt: str) -> str:
    return prompt.split(":", 1)[1]


@dataclass(frozen=True)
class Task:
    """A synthetic task: `make(rng)` -> (prompt, one valid answer); `check(prompt, answer)` -> valid?"""

    name: str
    make: Callable[[random.Random], tuple[str, str]]
    check: Callable[[str, str], bool]
    multi_form: bool


def _sort_make(rng):
    letters = _distinct(rng, rng.randint(4, 7))
    ordered = "".join(sorted(letters))
    return "sort:" + "".join(letters), f"{ordered},{ordered[::-1]}"


def _sort_check(prompt, answer):
    ordered = "".join(sorted(_argument(prompt)))
    return answer == f"{ordered},{ordered[::-1]}"


def _perm_make(rng):
    letters = sorted(_distinct(rng, rng.randint(3, 5)))
    order = letters[:]
    rng.shuffle(order)
    order = "".join(order)
    return "perm:" + "".join(letters), f"{''.join(letters)}={order}={order[::-1]}"


def _perm_check(prompt, answer):
    letters = _argument(prompt)
    parts = answer.split("=")
    return (len(parts) == 3 and parts[0] == letters and sorted(parts[1]) == sorted(letters)
            and parts[2] == parts[1][::-1])


def _swap_make(rng):
    # the answer used to end with how many pairs were swapped: the 20-layer model never learned that count
    # (35% of held-out swap answers right), so it ends with a reversal of what was written, a sure span
    letters = "".join(_distinct(rng, 8))
    pairs = [letters[i : i + 2] for i in range(0, 8, 2)]
    written = "-".join(p[::-1] if rng.random() < 0.5 else p for p in pairs)
    return "swap:" + letters, f"{written}={written[::-1]}"


def _swap_check(prompt, answer):
    letters = _argument(prompt)
    pairs = [letters[i : i + 2] for i in range(0, len(letters), 2)]
    written, reversed_ = answer.split("=")
    parts = written.split("-")
    if len(parts) != len(pairs) or reversed_ != written[::-1]:
        return False
    return all(w in (p, p[::-1]) for w, p in zip(parts, pairs, strict=True))


def _pair_make(rng):
    # prompt "pair:<n>:<tag>" with a random 3-letter tag, so that the prompt space is large enough for a
    # held-out split; the answer copies the tag, then writes n as a sum of two digits, both ways round
    n = rng.randint(3, 15)
    a = rng.randint(max(0, n - 9), min(9, n))
    tag = "".join(rng.choice(_LETTERS) for _ in range(3))
    return f"pair:{n}:{tag}", f"{tag},{a}+{n - a}={n},{n - a}+{a}={n}"


def _pair_check(prompt, answer):
    _, n, tag = prompt.split(":")
    copy, first, second = answer.split(",")
    left, total = first.split("=")
    parts = left.split("+")
    if copy != tag or total != n or len(parts) != 2 or not all(len(p) == 1 and p.isdigit() for p in parts):
        return False
    return int(parts[0]) + int(parts[1]) == int(n) and second == f"{parts[1]}+{parts[0]}={n}"


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("sort", _sort_make, _sort_check, multi_form=False),
        Task("perm", _perm_make, _perm_check, multi_form=True),
        Task("swap", _swap_make, _swap_check, multi_form=True),
        Task("pair", _pair_make, _pair_check, multi_form=True),
    )
}


def check_answer(task: str, prompt: str, answer: str) -> bool:
    """Exact check of one answer (a malformed answer is simply wrong)."""
    try:
        return TASKS[task].check(prompt, answer)
    except (ValueError, KeyError, IndexError):
        return False


def training_sample(rng: random.Random, tasks: tuple[str, ...] | None = None) -> tuple[str, str, str]:
    """(task, prompt, answer) from the training split (held-out prompts are skipped)."""
    names = tasks or tuple(TASKS)
    while True:
        name = rng.choice(names)
        prompt, answer = TASKS[name].make(rng)
        if not is_held_out(prompt):
            return name, prompt, answer


@dataclass(frozen=True)
class ReferenceItem:
    id: str
    task: str
    prompt: str
    reference_answer: str

    def check(self, answer: str) -> bool:
        return check_answer(self.task, self.prompt, answer)


def held_out_items(per_task: int = 40, seed: int = 1234, tasks: tuple[str, ...] | None = None) -> list[ReferenceItem]:
    """`per_task` distinct held-out items of each task, the same list for the same arguments."""
    items: list[ReferenceItem] = []
    for name in tasks or tuple(TASKS):
        rng = random.Random(f"{seed}-{name}")
        seen: set[str] = set()
        for _ in range(200_000):
            if len(seen) == per_task:
                break
            prompt, answer = TASKS[name].make(rng)
            if is_held_out(prompt) and prompt not in seen:
                seen.add(prompt)
                items.append(ReferenceItem(f"{name}-{len(seen) - 1}", name, prompt, answer))
        if len(seen) < per_task:
            raise ValueError(f"task {name!r} has fewer than {per_task} held-out prompts.")
    return items
