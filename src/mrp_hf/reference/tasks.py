"""Synthetic tasks of the reference DLM, with exact checkers and a held-out split.

Each task makes (prompt, answer) pairs from a seeded `random.Random` and checks any answer exactly. Three of
the four tasks have several valid answers whose tokens depend on each other, which is where revealing many
tokens in one step goes wrong (each position's argmax comes from its own marginal, so forms get mixed):
- `perm`: any ordering of the given letters (the training answers are uniformly random orderings);
- `pick`: any three distinct letters of the given six, in any order;
- `pair`: two digits whose sum is the given number, written "a+b" (every split is a valid answer).
`sort` (sort the given letters) has one valid answer.

Key-value recall, reversal and two-digit addition were tried too: after 2000 training steps the model
solved under 5% of them, so they do not fit the 20-minute CPU budget of the reference model.

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
#: of ANSWER_LENGTH tokens (one block of the model's 8: answers have at most 7 characters)
PROMPT_LENGTH = 16
ANSWER_LENGTH = 8

_LETTERS = "abcdefghijkl"


def is_held_out(prompt: str) -> bool:
    return zlib.crc32(prompt.encode()) % HELD_OUT_MODULUS == 0


def _distinct(rng: random.Random, count: int) -> list[str]:
    return rng.sample(_LETTERS, count)


@dataclass(frozen=True)
class Task:
    """A synthetic task: `make(rng)` -> (prompt, one valid answer); `check(prompt, answer)` -> valid?"""

    name: str
    make: Callable[[random.Random], tuple[str, str]]
    check: Callable[[str, str], bool]
    multi_form: bool


def _sort_make(rng):
    letters = _distinct(rng, rng.randint(3, 7))
    return "sort:" + "".join(letters), "".join(sorted(letters))


def _sort_check(prompt, answer):
    return answer == "".join(sorted(prompt.split(":", 1)[1]))


def _perm_make(rng):
    letters = _distinct(rng, rng.randint(3, 6))
    order = letters[:]
    rng.shuffle(order)
    return "perm:" + "".join(sorted(letters)), "".join(order)


def _perm_check(prompt, answer):
    return sorted(answer) == sorted(prompt.split(":", 1)[1])


def _pick_make(rng):
    pool = sorted(_distinct(rng, 6))
    return "pick:" + "".join(pool), "".join(rng.sample(pool, 3))


def _pick_check(prompt, answer):
    pool = prompt.split(":", 1)[1]
    return len(answer) == 3 and len(set(answer)) == 3 and all(c in pool for c in answer)


def _pair_make(rng):
    # prompt "pair:<n>:<tag>" with a random 3-letter tag, so that the prompt space is large enough for a
    # held-out split; the tag is noise the model must ignore
    n = rng.randint(3, 15)
    a = rng.randint(max(0, n - 9), min(9, n))
    tag = "".join(rng.choice(_LETTERS) for _ in range(3))
    return f"pair:{n}:{tag}", f"{a}+{n - a}"


def _pair_check(prompt, answer):
    n = int(prompt.split(":")[1])
    parts = answer.split("+")
    return len(parts) == 2 and all(len(p) == 1 and p.isdigit() for p in parts) and int(parts[0]) + int(parts[1]) == n


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("sort", _sort_make, _sort_check, multi_form=False),
        Task("perm", _perm_make, _perm_check, multi_form=True),
        Task("pick", _pick_make, _pick_check, multi_form=True),
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
