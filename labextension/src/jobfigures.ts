/**
 * Figures of a job's view beyond its loss: device-seconds used against a run's budget, and the
 * sampler ↔ trainer mismatch series of RL losses. The words are the cell widget's
 * (`cortex_nb/widgets/job_view.py`), the numbers the backend's (the job's `device_seconds`, the progress
 * record's `budget_device_s`, `mismatch_history` and `sampler_mismatch_max`): nothing recomputed.
 * Pure: no JupyterLab imports, unit-tested with jest.
 */
import { formatLoss } from './format';
import { IJobView, IProgress } from './types';

/** "1,234 device-s of 600 budget": the backend's count, the one a budget is spent against. */
export function deviceSecondsText(job: Pick<IJobView, 'device_seconds' | 'progress'>): string | null {
  const used = job.device_seconds;
  if (used === null || used === undefined) {
    return null;
  }
  const budget = job.progress?.budget_device_s;
  const whole = (value: number): string => Math.round(value).toLocaleString('en-US');
  return `${whole(used)} device-s` + (budget ? ` of ${whole(budget)} budget` : '');
}

/** The mean |sampler logprob − trainer logprob| per step, where an RL loss reported it. */
export function mismatchPoints(record: IProgress | null): Array<[number, number]> {
  return (record?.mismatch_history ?? [])
    .filter(point => point.sampler_mismatch_mean !== null)
    .map(point => [point.step, point.sampler_mismatch_mean as number]);
}

/** The mismatch chart's title, with the last step's largest gap when the backend reports it. */
export function mismatchTitle(record: IProgress | null): string {
  const worst = record?.sampler_mismatch_max;
  return 'sampler ↔ trainer mismatch, mean |Δ logprob|'
    + (worst !== null && worst !== undefined ? ` · last max ${formatLoss(worst)}` : '');
}
