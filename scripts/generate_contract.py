"""Write labextension/src/contract.ts: the proxied routes, job and request states, failure codes,
progress phases, the display words of job states (`displayState`) and versions, copied from the Python
source of truth (cortex_nb/protocol/: routes.py, states.py, errors.py, versions.py); and
labextension/src/types.ts: the JSON shapes the panel reads, from the schemas' JSON Schema
(cortex_nb/protocol/typescript.py says how).

`displayState` is code, not data: its TypeScript is a hand translation of `states.display_state` kept
here, and this script also writes labextension/test/fixtures/display_states.json, the words and details
Python gives for a set of jobs, which the panel's jest test checks the TypeScript against.

    python scripts/generate_contract.py           # rewrite the three files
    python scripts/generate_contract.py --check   # exit 1 if any is out of date (tests/test_contract_ts.py)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "labextension" / "src" / "contract.ts"
TYPES = ROOT / "labextension" / "src" / "types.ts"
FIXTURE = ROOT / "labextension" / "test" / "fixtures" / "display_states.json"

# The TypeScript twin of cortex_nb.protocol.states.clock and display_state (see the module docstring).
DISPLAY_STATE_TS = """
/** Python's round(): halves go to the even neighbour, so both languages write the same clock. */
function roundHalfEven(value: number): number {
  const rounded = Math.round(value);
  return Math.abs(value % 1) === 0.5 && rounded % 2 !== 0 ? rounded - 1 : rounded;
}

/** A duration as m:ss (or h:mm:ss): how the views write ETAs and countdowns. */
export function clock(seconds: number): string {
  const total = Math.max(roundHalfEven(seconds), 0);
  const hours = Math.floor(total / 3600);
  const minutes = Math.floor((total % 3600) / 60);
  const secs = total % 60;
  const two = (n: number): string => String(n).padStart(2, '0');
  return hours ? `${hours}:${two(minutes)}:${two(secs)}` : `${minutes}:${two(secs)}`;
}

/** What displayState reads of a job: its status, and whichever of these parts of the job JSON it has. */
export type IDisplayStateJob = Pick<IJobView, 'status'> &
  Partial<
    Pick<IJobView, 'progress' | 'queue' | 'idle' | 'keep_alive_until' | 'sub_jobs' | 'failure_code' | 'failure_message'>
  >;

/** The word for a job (one of DISPLAY_WORDS) and an optional detail: the same as the widget and %cortex jobs. */
export function displayState(job: IDisplayStateJob, nowS: number = Date.now() / 1000): [string, string | null] {
  const progress = job.progress ?? null;
  if (job.status === 'pending') {
    const queue = job.queue ?? null;
    let detail: string | null = null;
    if (queue?.reason) {
      detail = `#${queue.position} in the queue: ${queue.reason}`;
      if (queue.estimate_s !== null && queue.estimate_s !== undefined) {
        detail += ` (about ${clock(queue.estimate_s)})`;
      }
    }
    return ['queued', detail];
  }
  if (job.status === 'starting') {
    return ['starting', null];
  }
  if (job.status === 'running') {
    const phase = progress?.phase;
    if (phase === 'training' && progress?.source === 'managed') {
      const total = progress.total_steps;
      return ['training', `step ${progress.step ?? 0}` + (total ? `/${total}` : '')];
    }
    if (phase === 'keep_alive') {
      const until = job.keep_alive_until;
      return ['sampling', until ? `keep-alive, freeing the device in ${clock(until - nowS)}` : 'keep-alive'];
    }
    if (job.idle) {
      return ['idle', `freeing the device in ${clock(job.idle.frees_at - nowS)}`];
    }
    const trains = (job.sub_jobs ?? []).some(sub => sub.type === 'training');
    if (trains) {
      return ['training', progress?.step ? `step ${progress.step}` : null];
    }
    return ['sampling', null];
  }
  if (job.status === 'failed') {
    const code = job.failure_code;
    const message = job.failure_message;
    return ['failed', code ? (message ? `${code}: ${message}` : code) : message ?? null];
  }
  if (job.status === 'cancelled') {
    return ['cancelled', null];
  }
  const total = progress?.total_steps;
  if (progress?.phase === 'stopped' && total && (progress.step ?? 0) < total) {
    const checkpoint = progress.last_checkpoint;
    return ['stopped', `at ${progress.step ?? 0}/${total}` + (checkpoint ? ` (checkpoint ${checkpoint})` : '')];
  }
  return ['done', null];
}

/** A loss with four significant digits ("1.234", "0.0002457"); "–" when there is none. */
export function formatLoss(value: number | null | undefined): string {
  if (value === null || value === undefined || !Number.isFinite(value)) {
    return '–';
  }
  return Number(value.toPrecision(4)).toString();
}

/** A rate with a unit: "2.7k tok/s", "652 tok/s", "3.1 steps/s"; '' when unknown. */
export function formatRate(value: number | null | undefined, unit: string): string {
  if (value === null || value === undefined || !Number.isFinite(value)) {
    return '';
  }
  if (value >= 1000) {
    return `${(value / 1000).toFixed(1)}k ${unit}`;
  }
  return `${value >= 10 ? value.toFixed(0) : value.toFixed(1)} ${unit}`;
}

/** Binary units: "512 B", "1.5 GiB", "120 GiB"; "–" when unknown. */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || !Number.isFinite(bytes)) {
    return '–';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value >= 100 || unit === 0 ? value.toFixed(0) : value.toFixed(1)} ${units[unit]}`;
}

/** "ETA 0:18 · 2.1k tok/s" while training, "took 0:49 · 2.1k tok/s" after, from the record only. */
export function progressTiming(progress: IJobView['progress'] | undefined): string {
  if (!progress) {
    return '';
  }
  const training = progress.phase === 'training';
  return [
    training && progress.eta_s !== null && progress.eta_s !== undefined ? `ETA ${clock(progress.eta_s)}` : '',
    !training && progress.elapsed_s !== null && progress.elapsed_s !== undefined ? `took ${clock(progress.elapsed_s)}` : '',
    formatRate(progress.tokens_per_s, 'tok/s')
  ]
    .filter(Boolean)
    .join(' · ');
}
"""

NOW = 1_764_567_890.0


def display_state_cases() -> list[dict]:
    """Jobs covering every branch of display_state, each with the `now` it is shown at."""
    training = [{"type": "training"}]
    sampling = [{"type": "sampling"}]
    managed = {"source": "managed", "phase": "training", "step": 42, "total_steps": 80}
    return [
        {
            "status": "pending",
            "queue": {
                "position": 2,
                "reason": "waiting for a cpu slot: 4/4 held by jobs q0, q1, q2",
                "estimate_s": 35.0,
            },
            "sub_jobs": training,
        },
        {
            "status": "pending",
            "queue": {"position": 1, "reason": "waiting for a cpu slot", "estimate_s": None},
            "sub_jobs": training,
        },
        {
            "status": "pending",
            "queue": {"position": 1, "reason": "waiting", "estimate_s": 3725.5},
            "sub_jobs": training,
        },
        {"status": "pending", "queue": None, "sub_jobs": training},
        {"status": "starting", "sub_jobs": training},
        {"status": "running", "progress": managed, "sub_jobs": training},
        {"status": "running", "progress": {**managed, "total_steps": None}, "sub_jobs": training},
        {
            "status": "running",
            "progress": {**managed, "phase": "keep_alive"},
            "keep_alive_until": NOW + 272.5,
            "sub_jobs": training,
        },
        {
            "status": "running",
            "progress": {**managed, "phase": "keep_alive"},
            "keep_alive_until": None,
            "sub_jobs": training,
        },
        {
            "status": "running",
            "progress": {**managed, "phase": "finished"},
            "idle": {"timeout_s": 300.0, "frees_at": NOW + 3.5},
            "sub_jobs": training,
        },
        {
            "status": "running",
            "progress": None,
            "idle": {"timeout_s": 300.0, "frees_at": NOW - 2.0},
            "sub_jobs": sampling,
        },
        {
            "status": "running",
            "progress": {"source": "primitive", "phase": "training", "step": 5, "total_steps": None},
            "sub_jobs": training,
        },
        {"status": "running", "progress": None, "sub_jobs": training},
        {"status": "running", "progress": None, "sub_jobs": sampling},
        {
            "status": "failed",
            "failure_code": "worker_crashed",
            "failure_message": "the worker died",
            "sub_jobs": training,
        },
        {
            "status": "failed",
            "failure_code": "backend_restarted",
            "failure_message": None,
            "sub_jobs": training,
        },
        {"status": "failed", "failure_code": None, "failure_message": None, "sub_jobs": training},
        {
            "status": "cancelled",
            "failure_code": "cancelled",
            "failure_message": "cancelled by the user",
            "sub_jobs": training,
        },
        {"status": "done", "progress": {**managed, "phase": "finished", "step": 80}, "sub_jobs": training},
        {
            "status": "done",
            "progress": {**managed, "phase": "stopped", "step": 31, "last_checkpoint": "final"},
            "sub_jobs": training,
        },
        {"status": "done", "progress": {**managed, "phase": "stopped", "step": 80}, "sub_jobs": training},
    ]


# Records whose numbers every view writes the same way (the fixture's `formats` cases).
FORMAT_VALUES = [0.0002457, 1.23456, 12345.6, 5e-05, 1e-07, 8.59, 0.0, 3.0, None, 652.3, 1712.0, 3.14159]
BYTE_VALUES = [512, 1536, 1.5 * 2**30, 120 * 2**30, None]
PROGRESS_RECORDS = [
    {"phase": "training", "eta_s": 232.4, "elapsed_s": 10.0, "tokens_per_s": 1712.0},
    {"phase": "training", "eta_s": None, "elapsed_s": 10.0, "tokens_per_s": 652.3},
    {"phase": "finished", "eta_s": None, "elapsed_s": 49.2, "tokens_per_s": 2100.0},
    {"phase": "stopped", "eta_s": None, "elapsed_s": None, "tokens_per_s": None},
    None,
]


def format_cases() -> dict:
    from cortex_nb.protocol import states

    return {
        "loss": [[value, states.format_loss(value)] for value in FORMAT_VALUES],
        "rate": [[value, states.format_rate(value, "tok/s")] for value in FORMAT_VALUES],
        "bytes": [[value, states.format_bytes(value)] for value in BYTE_VALUES],
        "timing": [[record, states.progress_timing(record)] for record in PROGRESS_RECORDS],
    }


def render_fixture() -> str:
    sys.path.insert(0, str(ROOT))
    from cortex_nb.protocol import states

    cases = [
        {"job": job, "now": NOW, "expected": list(states.display_state(job, NOW))}
        for job in display_state_cases()
    ]
    return (
        json.dumps(
            {"generated_by": "scripts/generate_contract.py", "cases": cases, "formats": format_cases()},
            indent=1,
        )
        + "\n"
    )


def render() -> str:
    sys.path.insert(0, str(ROOT))
    from cortex_nb.protocol import errors, routes, states
    from cortex_nb.protocol import versions as version
    from cortex_nb.protocol.schemas.base import LABEL_KEY

    def literal(value: object) -> str:
        return json.dumps(value, ensure_ascii=False)

    lines = [
        "// Generated by scripts/generate_contract.py from cortex_nb/protocol (routes.py, states.py, versions.py).",
        "// Do not edit: change the Python source and run `python scripts/generate_contract.py`.",
        "",
        "import { IJobView } from './types';",
        "",
        f"export const PACKAGE_VERSION = {literal(version.__version__)};",
        f"export const API_VERSION = {literal(version.API_VERSION)};",
        "",
        "export interface IRouteSpec {",
        "  readonly name: string;",
        "  readonly method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';",
        "  /** `{name}` placeholders each fill one path segment. */",
        "  readonly template: string;",
        "}",
        "",
        "/** The backend routes the Jupyter server extension forwards (routes marked `proxied`). */",
        "export const PROXIED_ROUTES: Readonly<Record<string, IRouteSpec>> = {",
    ]
    for route in routes.ROUTES:
        if route.proxied:
            lines.append(
                f"  {route.name}: {{ name: {literal(route.name)}, method: {literal(route.method)},"
                f" template: {literal(route.template)} }},"
            )
    lines += [
        "};",
        "",
        f"export const JOB_STATES = {literal(list(states.JOB_STATES))} as const;",
        "export type JobState = (typeof JOB_STATES)[number];",
        f"export const JOB_TERMINAL: readonly string[] = {literal(sorted(states.JOB_TERMINAL))};",
        "",
        f"export const REQUEST_STATES = {literal(list(states.REQUEST_STATES))} as const;",
        "export type RequestState = (typeof REQUEST_STATES)[number];",
        f"export const REQUEST_TERMINAL: readonly string[] = {literal(sorted(states.REQUEST_TERMINAL))};",
        "",
        "/** Stable failure codes and what each means. */",
        "export const FAILURE_CODES: Readonly<Record<string, string>> = {",
    ]
    lines += [f"  {literal(code)}: {literal(text)}," for code, text in errors.FAILURE_CODES.items()]
    lines += [
        "};",
        "",
        "/** The label of the short-lived jobs compare and sampling on demand start: the sidebar hides them. */",
        f"export const PURPOSE_LABEL = {literal(states.PURPOSE_LABEL)};",
        f"export const SHORT_LIVED_PURPOSES: readonly string[] = {literal(list(states.SHORT_LIVED_PURPOSES))};",
        "/** Labels the tool keeps for itself: not shown as tags, kept when the tags are edited. */",
        f"export const INTERNAL_LABELS: readonly string[] = {literal(list(states.INTERNAL_LABELS))};",
        "/** What a label's name may be (the backend refuses others with the field named). */",
        f"export const LABEL_KEY_PATTERN = new RegExp({literal(LABEL_KEY)});",
        "",
        "/** Where a job's training is (its progress record's `phase`). */",
        f"export const PROGRESS_PHASES = {literal(list(states.PROGRESS_PHASES))} as const;",
        "",
        "/** One word per state, everywhere a job is shown (the widget, %cortex jobs, the sidebar). */",
        f"export const DISPLAY_WORDS = {literal(list(states.DISPLAY_WORDS))} as const;",
        "export type DisplayWord = (typeof DISPLAY_WORDS)[number];",
    ]
    lines += DISPLAY_STATE_TS.splitlines()
    lines += [""]
    return "\n".join(lines)


def render_types() -> str:
    sys.path.insert(0, str(ROOT))
    from cortex_nb.protocol import typescript

    return typescript.render()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the file is up to date")
    args = parser.parse_args(argv)
    outputs = {TARGET: render(), TYPES: render_types(), FIXTURE: render_fixture()}
    if args.check:
        stale = [
            path for path, text in outputs.items() if (path.read_text() if path.exists() else "") != text
        ]
        for path in stale:
            print(
                f"{path.relative_to(ROOT)} is out of date: run python scripts/generate_contract.py",
                file=sys.stderr,
            )
        return 1 if stale else 0
    for path, text in outputs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
