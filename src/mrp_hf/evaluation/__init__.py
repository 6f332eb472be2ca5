"""Evaluation: tasks (HumanEval, GSM8K-style JSONL, registered tasks), a sandbox for generated code, and a
runner that decodes the same prompts with several modes and reports accuracy next to speed.

See docs/evaluation.md. `mrp-hf eval` is the command-line front end.
"""

from .runner import (
    ROW_KEYS,
    format_table,
    load_results,
    mode_generate_kwargs,
    mode_label,
    pareto_frontier,
    parse_mode,
    parse_modes,
    plot_rows,
    run_modes,
    write_json,
)
from .sandbox import (
    FunctionCheck,
    SandboxConfig,
    SandboxResult,
    SandboxStatus,
    SandboxUnavailableError,
    require_sandbox,
    run_function_check,
    run_function_checks,
    run_program,
    run_programs,
    sandbox_status,
)
from .tasks import (
    EvalItem,
    EvalTask,
    GSM8KTask,
    HumanEvalTask,
    ItemsTask,
    JsonlTask,
    as_task,
    available_tasks,
    extract_gsm8k_answer,
    get_task,
    gsm8k_gold,
    normalize_number,
    register_task,
    truncate_at_stops,
)

__all__ = [
    "ROW_KEYS", "EvalItem", "EvalTask", "FunctionCheck", "GSM8KTask", "HumanEvalTask", "ItemsTask", "JsonlTask",
    "SandboxConfig", "SandboxResult", "SandboxStatus", "SandboxUnavailableError", "as_task", "available_tasks",
    "extract_gsm8k_answer", "format_table", "get_task", "gsm8k_gold", "load_results", "mode_generate_kwargs",
    "mode_label", "normalize_number", "pareto_frontier", "parse_mode", "parse_modes", "plot_rows", "register_task", "require_sandbox",
    "run_function_check", "run_function_checks", "run_modes", "run_program", "run_programs", "sandbox_status",
    "truncate_at_stops", "write_json",
]
