/**
 * What the panel shows of each job, from the backend's job JSON: the display word and detail (the
 * widget's and `%cortex jobs`' words, from the generated contract), training progress as the backend's
 * progress record has it, the actions a job offers, and the summary of a finished training.
 * Pure: no JupyterLab imports, unit-tested with jest.
 */
import { JOB_TERMINAL, displayState, progressTiming } from './contract';
import { formatAge, formatLoss } from './format';
import { formatStart, jobTags } from './joblist';
import { IJobView, IProgress } from './types';

export function isTerminal(status: string): boolean {
  return JOB_TERMINAL.includes(status);
}

/** A job's name where it has one (tabs, pickers and lists show names), else its id. */
export function jobTitle(job: Pick<IJobView, 'job_id' | 'name'>): string {
  return job.name || job.job_id;
}

/** "name (job-…)" for pickers, where both matter. */
export function jobLabel(job: Pick<IJobView, 'job_id' | 'name'>): string {
  return job.name ? `${job.name} (${job.job_id})` : job.job_id;
}

export interface IProgressLine {
  step: number | null;
  total: number | null;
  /** 0..1 when the total is known. */
  fraction: number | null;
  /** "step 42/80" */
  label: string;
  /** "loss per token 1.234 · eval 1.5" or '' */
  loss: string;
  /** "ETA 0:18 · 2.1k tok/s" while training, "took 0:49 · 2.1k tok/s" after, or '' */
  timing: string;
}

/** Training progress, exactly as the backend's progress record reports it (nothing recomputed). */
export function jobProgress(job: IJobView): IProgressLine {
  const record = job.progress;
  if (!record) {
    return { step: null, total: null, fraction: null, label: '', loss: '', timing: '' };
  }
  const total = record.total_steps ?? null;
  const step = record.step;
  const losses = [
    record.loss_per_token !== null ? `loss per token ${formatLoss(record.loss_per_token)}` : '',
    record.eval_loss_per_token !== null ? `eval ${formatLoss(record.eval_loss_per_token)}` : ''
  ].filter(Boolean);
  // The widget's stats line writes the same fields the same way (cortex_nb.protocol.states.progress_timing).
  const timing = progressTiming(record);
  return {
    step,
    total,
    fraction: total ? Math.min(1, step / total) : null,
    label: total ? `step ${step}/${total}` : `step ${step}`,
    loss: losses.join(' · '),
    timing
  };
}

export interface IJobRow {
  jobId: string;
  title: string;
  /** One of DISPLAY_WORDS: the badge. */
  word: string;
  /** Why it waits, when it frees its device, where training is, or why it failed. */
  detail: string | null;
  status: string;
  terminal: boolean;
  age: string;
  model: string;
  device: string;
  progress: IProgressLine;
  queuePosition: number | null;
  /** "2026-12-02 11:38": when it started (or, while it waits, was created). */
  start: string;
  /** Its labels as `key=value` tags. */
  tags: string[];
}

export function jobRow(job: IJobView, nowS: number): IJobRow {
  const models = Array.from(new Set(job.sub_jobs.map(sub => sub.base_model)));
  const devices = Array.from(new Set(job.sub_jobs.map(sub => sub.device).filter(Boolean))) as string[];
  const [word, detail] = displayState(job, nowS);
  return {
    jobId: job.job_id,
    title: jobTitle(job),
    word,
    detail,
    status: job.status,
    terminal: isTerminal(job.status),
    age: formatAge(job.created_at, nowS),
    model: models.join(', '),
    device: devices.join(', '),
    progress: jobProgress(job),
    queuePosition: job.queue?.position ?? null,
    start: formatStart(job),
    tags: jobTags(job)
  };
}

/** Jobs that need watching first (running, then queued), then the finished ones, newest first. */
export function sortJobs(jobs: IJobView[]): IJobView[] {
  const rank = (job: IJobView): number => (isTerminal(job.status) ? 1 : 0);
  return [...jobs].sort((a, b) => rank(a) - rank(b) || b.created_at - a.created_at);
}

/** A job that trained at least one step. */
export function hasTrained(job: IJobView): boolean {
  return (job.progress?.step ?? 0) > 0;
}

export interface ITrainingSummary {
  jobId: string;
  title: string;
  word: string;
  model: string;
  steps: number;
  totalSteps: number | null;
  finalLoss: number | null;
  finalEval: number | null;
  durationS: number | null;
  finishedAt: number | null;
  start: string;
  tags: string[];
}

export function trainingSummary(job: IJobView, nowS: number): ITrainingSummary | null {
  const record = job.progress;
  if (!record || !hasTrained(job)) {
    return null;
  }
  return {
    jobId: job.job_id,
    title: jobTitle(job),
    word: displayState(job, nowS)[0],
    model: Array.from(new Set(job.sub_jobs.map(sub => sub.base_model))).join(', '),
    steps: record.step,
    totalSteps: record.total_steps,
    finalLoss: record.loss_per_token,
    finalEval: record.eval_loss_per_token,
    durationS: record.elapsed_s,
    finishedAt: job.finished_at,
    start: formatStart(job),
    tags: jobTags(job)
  };
}

/** Trainings that have ended (done, cancelled or failed after training), newest first. */
export function finishedTrainings(jobs: IJobView[], nowS: number): ITrainingSummary[] {
  return sortJobs(jobs.filter(job => isTerminal(job.status)))
    .map(job => trainingSummary(job, nowS))
    .filter((summary): summary is ITrainingSummary => summary !== null);
}

/** The sidebar's job list: every job still going, and finished jobs that never trained. */
export function listedJobs(jobs: IJobView[]): IJobView[] {
  return sortJobs(jobs.filter(job => !isTerminal(job.status) || !hasTrained(job)));
}

/** Trained steps no checkpoint holds yet; null when the record cannot tell. */
export function unsavedSteps(record: IProgress | null): number | null {
  if (!record || record.step <= 0) {
    return 0;
  }
  if (record.last_checkpoint === null) {
    return record.step;
  }
  const saved = record.last_checkpoint_step ?? null;
  return saved === null ? null : Math.max(0, record.step - saved);
}

export interface IJobActions {
  /** Stop now, keep nothing since the last checkpoint. */
  cancel: boolean;
  /** Complete the job: saves the trained adapter as checkpoint `final` first, then frees the device. */
  freeDevice: boolean;
  /** Set when Cancel would throw trained steps away: the confirmation to ask. */
  cancelWarning: string | null;
  /** A trainer still training: save a resumable checkpoint now, or stop after the step in hand keeping the adapter. */
  saveCheckpoint: boolean;
  stopAndSave: boolean;
}

/** The confirmation Cancel asks when trained steps would be lost: the same three choices as the cell widget. */
export const CANCEL_CHOICES = {
  keep: 'Keep training',
  stopAndSave: 'Stop and save',
  discard: 'Cancel and discard'
} as const;

/**
 * A training that has finished (keep-alive, or idle until the backend frees it) offers "Free device",
 * never Cancel; a job still working offers Cancel, with a confirmation when trained steps would be lost.
 */
export function jobActions(job: IJobView): IJobActions {
  const none = { saveCheckpoint: false, stopAndSave: false };
  if (isTerminal(job.status)) {
    return { cancel: false, freeDevice: false, cancelWarning: null, ...none };
  }
  if (job.status !== 'running') {
    return { cancel: true, freeDevice: false, cancelWarning: null, ...none };
  }
  const phase = job.progress?.phase;
  const finished = phase === 'keep_alive' || phase === 'finished' || job.idle !== null;
  if (finished) {
    return { cancel: false, freeDevice: true, cancelWarning: null, ...none };
  }
  const trains = job.sub_jobs.some(sub => sub.type === 'training');
  const unsaved = unsavedSteps(job.progress);
  const record = job.progress;
  let warning: string | null = null;
  if (unsaved === null || unsaved > 0) {
    const since = record?.last_checkpoint ? `since checkpoint ${record.last_checkpoint}` : 'so far (no checkpoint yet)';
    warning =
      `Cancel stops ${jobTitle(job)} now and keeps nothing: ` +
      `${unsaved === null ? 'the trained steps' : `${unsaved} trained step${unsaved === 1 ? '' : 's'}`} ${since} would be lost. ` +
      `${CANCEL_CHOICES.stopAndSave} stops after the step in hand and keeps the adapter as checkpoint "final".`;
  }
  return { cancel: true, freeDevice: false, cancelWarning: warning, saveCheckpoint: trains, stopAndSave: trains };
}
