"""The managed training loop: a `training_loop` spec run inside the training worker.

The kernel only submits and watches, so a run outlives any kernel. The loop cuts the uploaded
examples into rows and batches with the same code a kernel's own loop over the primitive API uses
(`cortex_nb.protocol.train_rows.pack_examples`, `PackedData.batches`, `rows_to_batch`), and calls the same
`Trainer.forward_backward` and `Trainer.step`, so both train on the same batches to the same losses.

Between steps it serves requests queued for the sub-job meanwhile (a sample, a checkpoint from the
widget), and it stops after the step in hand when its request is cancelled ("Free device"). Every
step, eval, sample and checkpoint is reported to the service, which folds it into the job's
progress record; when the loop ends normally the adapter is saved as checkpoint `final`.

A loop may start from a checkpoint: `init_from` (a new run that begins with another run's adapter,
and optionally its optimizer state; its own steps count from 0) or `resume_from` (the same run after
a backend restart: adapter, optimizer, step and RNG restored, the batches already trained skipped, so
it goes on exactly as if never stopped). When the backend drains, the loop stops after the step in
hand and saves a resumable checkpoint for the next start (status `drained`). Without `save` in the
spec, a resumable checkpoint is still written every `AUTO_SAVE_S` seconds of training (only the
newest is kept), so a crash loses at most that much work.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cortex_nb.protocol.checkpoint_format import (
    AUTO_CHECKPOINT_PREFIX,
    DRAINED_CHECKPOINT_PREFIX,
    FINAL_CHECKPOINT,
    RESUMABLE,
    WEIGHTS_ONLY,
)
from cortex_nb.protocol.schemas.sampling import SamplingParams
from cortex_nb.protocol.schemas.spec_errors import SpecError
from cortex_nb.protocol.schemas.training_loop import TrainingLoop as LoopSpec
from cortex_nb.protocol.train_rows import PackedData, examples_from_jsonl, pack_examples

from ..faults import Faults
from .errors import OperationError
from .model_state import ModelState
from .trainer import Trainer

TEMP_PREFIX = ".tmp-"
# Without `save` in the spec: a resumable checkpoint after the step that ends this much training time
# (the service keeps only the newest of them). Adapter and optimizer state only, never the base.
AUTO_SAVE_S = 120.0

Report = Callable[[dict[str, Any]], None]


class TrainingLoop:
    def __init__(
        self,
        state: ModelState,
        trainer: Trainer,
        params: dict[str, Any],
        blob: bytes,
        report: Report,
        serve_waiting: Callable[[], None],
        stop_requested: Callable[[], bool],
        faults: Faults,
        drain_requested: Callable[[], bool] = lambda: False,
    ) -> None:
        self.state = state
        self.trainer = trainer
        self.params = params
        self.blob = blob
        self.report = report
        self.serve_waiting = serve_waiting
        self.stop_requested = stop_requested
        self.faults = faults
        self.checkpoint_dir = Path(params["checkpoint_dir"])
        self.drain_requested = drain_requested
        # (checkpoint id, step) of the newest resumable checkpoint this loop wrote
        self.last_resumable: tuple[str, int] | None = None

    # the loop -----------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train to the end (or until stopped); returns a summary. Failures raise `OperationError`
        after reporting `ended` with their code."""
        try:
            # The service checked and normalised it (`TrainingLoop` in `POST /v1/jobs`): this reads it back.
            spec = LoopSpec.model_validate(self.params["spec"])
            data, eval_data = self._data(spec)
            self.faults.raise_in("training_loop_data_loaded")
            total = spec.planned_steps(data.steps_per_epoch(spec.batch_size))
            self.report(
                {
                    "event": "started",
                    "total_steps": total,
                    "examples": data.examples,
                    "rows": len(data.rows),
                    "tokens": data.tokens,
                    "at": time.time(),
                }
            )
            print(
                f"[engine] managed training: {total} steps of {spec.batch_size} x {spec.max_seq_len} tokens"
                f" ({data.examples} examples, {data.tokens} tokens, {len(data.rows)} rows)",
                flush=True,
            )
            first_step = self._start_from(spec)
            stopped = self._train(spec, data, eval_data, total, first_step)
            if stopped and self.drain_requested():
                return self._drained()
            saved = (
                self._save(FINAL_CHECKPOINT, spec.save.type if spec.save else WEIGHTS_ONLY)
                if self.trainer.step_count > 0
                else None
            )
        except OperationError as exc:
            self.report({"event": "ended", "status": "failed", "code": exc.code, "message": exc.message})
            raise
        except SpecError as exc:
            self.report(
                {"event": "ended", "status": "failed", "code": "invalid_dataset", "message": exc.message}
            )
            raise OperationError("invalid_dataset", exc.message) from None
        except Exception as exc:
            code = "out_of_memory" if "out of memory" in str(exc).lower() else "training_loop_failed"
            message = f"the training loop failed: {type(exc).__name__}: {exc}"
            self.report({"event": "ended", "status": "failed", "code": code, "message": message})
            raise OperationError(code, message) from exc
        status = "stopped" if stopped else "finished"
        self.report(
            {"event": "ended", "status": status, "step": self.trainer.step_count, "checkpoint": saved}
        )
        print(
            f"[engine] managed training {status} at step {self.trainer.step_count}"
            + (f"; saved checkpoint {saved}" if saved else ""),
            flush=True,
        )
        if stopped:
            raise OperationError(
                "cancelled",
                f"stopped at step {self.trainer.step_count}"
                + (f"; the adapter is saved as checkpoint {saved!r}" if saved else ""),
            )
        return {"status": status, "step": self.trainer.step_count, "checkpoint": saved}

    def _data(self, spec: LoopSpec) -> tuple[PackedData, PackedData | None]:
        tokenizer = self.state.tokenizer
        if tokenizer is None:
            raise OperationError(
                "unsupported_operation",
                f"model {self.state.info.name} has no tokenizer.json: a managed"
                " loop cannot tokenize its data; train it through the primitive API",
            )

        def tokenize(texts: list[str], add_special_tokens: bool) -> list[list[int]]:
            return [tokenizer.encode(text, add_special_tokens=add_special_tokens) for text in texts]

        split = int(self.params["data_bytes"])
        train_text, eval_text = self.blob[:split].decode("utf-8"), self.blob[split:].decode("utf-8")
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        data = pack_examples(
            examples_from_jsonl(train_text.splitlines(), "the dataset"),
            tokenize,
            eos,
            pad,
            spec.max_seq_len,
            spec.packing,
        )
        eval_data = None
        if spec.eval is not None:
            eval_data = pack_examples(
                examples_from_jsonl(eval_text.splitlines(), "the eval dataset", "eval.data"),
                tokenize,
                eos,
                pad,
                spec.max_seq_len,
                spec.packing,
            )
        return data, eval_data

    def _start_from(self, spec: LoopSpec) -> int:
        """Load the checkpoint this loop starts from, if any; the number of steps already trained."""
        from .checkpoint import load_checkpoint

        resume = self.params.get("resume_from")
        init = self.params.get("init_from")
        if resume:
            result = load_checkpoint(
                self.state, self.trainer, Path(resume["directory"]), resume["manifest"], True
            )
            self.last_resumable = (resume["checkpoint_id"], result["step"])
            self.report(
                {"event": "resumed", "checkpoint_id": resume["checkpoint_id"], "step": result["step"]}
            )
            print(
                f"[engine] resumed from checkpoint {resume['checkpoint_id']} at step {result['step']}"
                f" (optimizer and RNG state restored)",
                flush=True,
            )
            return int(result["step"])
        if init:
            result = load_checkpoint(
                self.state,
                self.trainer,
                Path(init["directory"]),
                init["manifest"],
                bool(init.get("restore_optimizer", True)),
            )
            # A new run: its own steps count from 0, whatever step the checkpoint was saved at.
            self.trainer.step_count = 0
            self.state.weight_version = 0
            print(
                f"[engine] initialised from checkpoint {init['checkpoint_id']} of {init['source_job_id']}"
                f" (step {result['step']}; optimizer state "
                + ("restored" if result["restored_optimizer"] else "fresh")
                + ")",
                flush=True,
            )
        return 0

    def _drained(self) -> dict[str, Any]:
        """The backend is draining: keep a resumable checkpoint of where the loop is, then end."""
        step = self.trainer.step_count
        if self.last_resumable is not None and self.last_resumable[1] == step:
            saved = self.last_resumable[0]
        else:
            saved = self._save(f"{DRAINED_CHECKPOINT_PREFIX}{step}", RESUMABLE)
        self.report({"event": "ended", "status": "drained", "step": step, "checkpoint": saved})
        print(
            f"[engine] the backend is stopping: paused at step {step}; checkpoint {saved} resumes it",
            flush=True,
        )
        return {"status": "drained", "step": step, "checkpoint": saved}

    def _train(
        self,
        spec: LoopSpec,
        data: PackedData,
        eval_data: PackedData | None,
        total: int,
        first_step: int = 0,
    ) -> bool:
        """The steps after `first_step`; True if stopped before the last one."""
        from cortex_nb.protocol.batching import rows_to_batch

        eval_batches = (
            eval_data.eval_batches(spec.batch_size, spec.eval.max_rows) if eval_data and spec.eval else []
        )
        prompts = (
            [self.state.tokenizer.encode(prompt) for prompt in spec.sample.prompts] if spec.sample else []
        )
        batches = data.batches(spec.batch_size, spec.seed)
        for _ in range(first_step):  # the batches trained before the checkpoint resumed from
            next(batches)
        trained_since_save = 0.0
        for step in range(first_step + 1, total + 1):
            started = time.monotonic()
            if self.stop_requested():
                return True
            batch = rows_to_batch(next(batches), data.pad_id)
            result, _ = self.trainer.forward_backward(batch, "cross_entropy", {})
            stepped = self.trainer.step()
            self.report(
                {
                    "event": "step",
                    "step": stepped["step"],
                    "loss": result["loss"],
                    "weights": float(batch["weights"].sum()),
                    "tokens": int(batch["attention_mask"].sum()),
                    "at": time.time(),
                }
            )
            weights = float(batch["weights"].sum())
            per_token = f" loss_per_token={result['loss'] / weights:.4g}" if weights else ""
            print(
                f"[engine] step={stepped['step']}{per_token} summed_loss={result['loss']:.4g}"
                f" grad_norm={stepped['grad_norm']:.4g} lr={stepped['learning_rate']:.3g} tokens={stepped['tokens']}",
                flush=True,
            )
            final = step == total
            if eval_batches and (final or step % spec.eval.every == 0):
                self._eval(stepped["step"], eval_batches)
            if prompts and (final or step % spec.sample.every == 0):
                self._sample(stepped["step"], spec, prompts)
            trained_since_save += time.monotonic() - started
            if spec.save and not final and step % spec.save.every == 0:
                self._save(f"step-{stepped['step']}", spec.save.type)
                trained_since_save = 0.0
            elif not spec.save and not final and trained_since_save >= AUTO_SAVE_S:
                self._save(f"{AUTO_CHECKPOINT_PREFIX}{stepped['step']}", RESUMABLE)
                trained_since_save = 0.0
            self.serve_waiting()
        return False

    def _eval(self, step: int, batches: list[dict[str, np.ndarray]]) -> None:
        from .scoring import forward

        summed = weights = 0.0
        for batch in batches:
            _, out = forward(self.state, batch)
            summed -= float((out["logprobs"] * batch["weights"]).sum())
            weights += float(batch["weights"].sum())
        self.report({"event": "eval", "step": step, "loss": summed, "weights": weights})

    def _sample(self, step: int, spec: LoopSpec, prompts: list[list[int]]) -> None:
        from .transformers_sampler import generate

        params = SamplingParams(
            max_tokens=spec.sample.max_tokens, temperature=float(spec.sample.temperature), seed=spec.seed
        ).model_dump()
        result = generate(self.state, prompts, params, self.stop_requested)
        items = [
            {"prompt": spec.sample.prompts[s["prompt_index"]], "text": s["text"] or ""}
            for s in result["samples"]
        ]
        self.report({"event": "samples", "step": step, "items": items})

    def _save(self, checkpoint_id: str, kind: str) -> str:
        """Write a checkpoint next to the job's others; the service checks, renames and records it."""
        from .checkpoint import write_checkpoint

        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        directory = self.checkpoint_dir / f"{TEMP_PREFIX}loop-{checkpoint_id}-{secrets.token_hex(4)}"
        manifest = write_checkpoint(self.state, self.trainer, directory, kind, self.faults)
        if kind == RESUMABLE:
            self.last_resumable = (checkpoint_id, self.trainer.step_count)
        self.report(
            {
                "event": "checkpoint",
                "checkpoint_id": checkpoint_id,
                "checkpoint_type": kind,
                "directory": str(directory),
                "manifest": manifest,
            }
        )
        return checkpoint_id
