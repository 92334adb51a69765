/**
 * Comparing trainings: one row of hyperparameters and final figures per job, as the backend's job
 * JSON and progress record have them (the same table `%cortex compare` prints).
 * Pure: no JupyterLab imports, unit-tested with jest.
 */
import { jobTitle } from './jobrows';
import { IJobView } from './types';

export interface ICompareRow {
  jobId: string;
  title: string;
  model: string;
  loraRank: number | null;
  learningRate: number | null;
  batchSize: number | null;
  steps: number | null;
  seed: number | null;
  finalLoss: number | null;
  finalEval: number | null;
  durationS: number | null;
  tokensPerS: number | null;
}

export function compareRow(job: IJobView): ICompareRow {
  const training = job.sub_jobs.find(sub => sub.type === 'training') ?? job.sub_jobs[0];
  const loop = job.training_loop ?? null;
  const record = job.progress;
  return {
    jobId: job.job_id,
    title: jobTitle(job),
    model: training?.base_model ?? '',
    loraRank: training?.lora?.r ?? null,
    learningRate: training?.optimizer?.lr ?? null,
    batchSize: typeof loop?.batch_size === 'number' ? loop.batch_size : null,
    steps: record?.step ?? null,
    seed: typeof loop?.seed === 'number' ? loop.seed : training?.seed ?? null,
    finalLoss: record?.loss_per_token ?? null,
    finalEval: record?.eval_loss_per_token ?? null,
    durationS: record?.elapsed_s ?? null,
    tokensPerS: record?.tokens_per_s ?? null
  };
}

/** The columns whose values differ between the trainings come first: they are what the comparison is about. */
export function differingColumns(rows: ICompareRow[]): Array<keyof ICompareRow> {
  const settings: Array<keyof ICompareRow> = ['model', 'loraRank', 'learningRate', 'batchSize', 'seed'];
  return settings.filter(key => new Set(rows.map(row => String(row[key]))).size > 1);
}
