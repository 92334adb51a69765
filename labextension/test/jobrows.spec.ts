import { JOB_STATES } from '../src/contract';
import { formatDuration, formatLoss, formatRate } from '../src/format';
import {
  finishedTrainings,
  CANCEL_CHOICES,
  jobActions,
  jobLabel,
  jobProgress,
  jobRow,
  listedJobs,
  sortJobs,
  unsavedSteps
} from '../src/jobrows';
import { job, progress } from './jobs';

describe('job rows', () => {
  it('lists active jobs first, newest first within each group', () => {
    const jobs = [
      job({ job_id: 'old-done', status: 'done', created_at: 50 }),
      job({ job_id: 'new-done', status: 'cancelled', created_at: 300 }),
      job({ job_id: 'old-running', status: 'running', created_at: 10 }),
      job({ job_id: 'new-pending', status: 'pending', created_at: 200 })
    ];
    expect(sortJobs(jobs).map(j => j.job_id)).toEqual(['new-pending', 'old-running', 'new-done', 'old-done']);
  });

  it('shows the display word of every state, never the raw status', () => {
    const words = JOB_STATES.map(state => jobRow(job({ status: state }), 2000).word);
    expect(words).toEqual(['queued', 'starting', 'training', 'done', 'failed', 'cancelled']);
  });

  it('says why a pending job waits and where it is in the queue', () => {
    const row = jobRow(job({
      status: 'pending', name: 'sweep-5',
      queue: { position: 1, reason: 'waiting for a cpu slot: 4/4 held by jobs sweep-1, sweep-2', blocked_by: ['job-a'], estimate_s: 35 }
    }), 2000);
    expect(row).toMatchObject({ title: 'sweep-5', word: 'queued', queuePosition: 1 });
    expect(row.detail).toBe('#1 in the queue: waiting for a cpu slot: 4/4 held by jobs sweep-1, sweep-2 (about 0:35)');
  });

  it('counts down to when an idle job frees its device', () => {
    const row = jobRow(job({ idle: { timeout_s: 300, frees_at: 2272 }, progress: progress({ phase: 'finished', step: 80 }) }), 2000);
    expect(row.word).toBe('idle');
    expect(row.detail).toBe('freeing the device in 4:32');
  });

  it('builds a row with model, device, age and failure', () => {
    const row = jobRow(job({ status: 'failed', failure_code: 'worker_crashed', failure_message: 'the worker died', name: 'lora-a' }), 1000 + 125);
    expect(row).toMatchObject({ jobId: 'job-1', title: 'lora-a', model: 'tiny', device: 'cpu', age: '2m', terminal: true, word: 'failed' });
    expect(row.detail).toBe('worker_crashed: the worker died');
  });

  it('names jobs in pickers by name and id', () => {
    expect(jobLabel(job({ name: 'lr-3e-3' }))).toBe('lr-3e-3 (job-1)');
    expect(jobLabel(job())).toBe('job-1');
  });
});

describe('progress from the backend record', () => {
  it('reads step, total, losses and timing as the record names them', () => {
    expect(jobProgress(job({ progress: progress() }))).toEqual({
      step: 42, total: 80, fraction: 42 / 80, label: 'step 42/80',
      loss: 'loss per token 1.235 · eval 1.5', timing: 'ETA 0:18 · 2.1k tok/s'
    });
  });

  it('has no total for a primitive loop, and says how long a finished one took', () => {
    const primitive = jobProgress(job({ progress: progress({ source: 'primitive', total_steps: null, step: 7 }) }));
    expect(primitive).toMatchObject({ fraction: null, label: 'step 7' });
    const finished = jobProgress(job({ progress: progress({ phase: 'finished', eta_s: null, elapsed_s: 49 }) }));
    expect(finished.timing).toBe('took 0:49 · 2.1k tok/s');
  });

  it('is empty for a job that never trained', () => {
    expect(jobProgress(job())).toMatchObject({ step: null, label: '', loss: '' });
  });
});

describe('finished trainings', () => {
  it('lists ended jobs that trained, with final loss and duration; the rest stay in the job list', () => {
    const jobs = [
      job({ job_id: 'a', status: 'done', created_at: 10, progress: progress({ phase: 'finished', step: 80, elapsed_s: 49 }) }),
      job({ job_id: 'b', status: 'cancelled', created_at: 20, progress: progress({ phase: 'stopped', step: 12 }) }),
      job({ job_id: 'c', status: 'done', created_at: 30, progress: null }),
      job({ job_id: 'd', status: 'running', created_at: 40, progress: progress() })
    ];
    const trainings = finishedTrainings(jobs, 2000);
    expect(trainings.map(t => [t.jobId, t.word, t.steps])).toEqual([['b', 'cancelled', 12], ['a', 'done', 80]]);
    expect(trainings[1]).toMatchObject({ finalLoss: 1.2345678, finalEval: 1.5, durationS: 49 });
    expect(listedJobs(jobs).map(j => j.job_id)).toEqual(['d', 'c']);
  });
});

describe('actions', () => {
  it('offers Free device, never Cancel, on a training that has finished', () => {
    for (const finished of [
      job({ progress: progress({ phase: 'keep_alive', step: 80 }), keep_alive_until: 2300 }),
      job({ progress: progress({ phase: 'finished', step: 80 }), idle: { timeout_s: 300, frees_at: 2300 } }),
      job({ progress: progress({ source: 'primitive', total_steps: null }), idle: { timeout_s: 300, frees_at: 2300 } })
    ]) {
      expect(jobActions(finished)).toEqual({ cancel: false, freeDevice: true, cancelWarning: null, saveCheckpoint: false, stopAndSave: false });
    }
  });

  it('asks before a Cancel throws trained steps away', () => {
    const unsaved = jobActions(job({ name: 'lr-3e-3', progress: progress({ last_checkpoint: 'step-40', last_checkpoint_step: 40 }) }));
    expect(unsaved.cancel).toBe(true);
    expect(unsaved.cancelWarning).toBe(
      'Cancel stops lr-3e-3 now and keeps nothing: 2 trained steps since checkpoint step-40 would be lost. ' +
        'Stop and save stops after the step in hand and keeps the adapter as checkpoint "final".');
    // The job view offers what the cell widget offers: Save checkpoint, and Stop and save (also in the dialog).
    expect(unsaved.saveCheckpoint).toBe(true);
    expect(unsaved.stopAndSave).toBe(true);
    expect(CANCEL_CHOICES).toEqual({ keep: 'Keep training', stopAndSave: 'Stop and save', discard: 'Cancel and discard' });
    const none = jobActions(job({ progress: progress() }));
    expect(none.cancelWarning).toContain('42 trained steps so far (no checkpoint yet) would be lost');
    const saved = jobActions(job({ progress: progress({ last_checkpoint: 'step-42', last_checkpoint_step: 42 }) }));
    expect(saved).toEqual({ cancel: true, freeDevice: false, cancelWarning: null, saveCheckpoint: true, stopAndSave: true });
    expect(jobActions(job({ status: 'pending' }))).toEqual({ cancel: true, freeDevice: false, cancelWarning: null, saveCheckpoint: false, stopAndSave: false });
    expect(jobActions(job({ status: 'done', progress: progress() }))).toEqual({ cancel: false, freeDevice: false, cancelWarning: null, saveCheckpoint: false, stopAndSave: false });
    const sampler = job({ progress: null, sub_jobs: [{ ...job().sub_jobs[0], type: 'sampling' }] });
    expect(jobActions(sampler).saveCheckpoint).toBe(false);  // nothing trains: nothing to save
  });

  it('assumes steps would be lost when the record cannot say which step a checkpoint holds', () => {
    expect(unsavedSteps(progress({ last_checkpoint: 'step-40', last_checkpoint_step: null }))).toBeNull();
    expect(jobActions(job({ progress: progress({ last_checkpoint: 'step-40', last_checkpoint_step: null }) })).cancelWarning)
      .toContain('the trained steps since checkpoint step-40 would be lost');
  });
});

describe('formatting', () => {
  it('writes losses, durations and rates', () => {
    expect(formatLoss(1.2345678)).toBe('1.235');
    expect(formatLoss(0.00024567)).toBe('0.0002457');
    expect(formatLoss(null)).toBe('–');
    expect(formatDuration(3725)).toBe('1:02:05');
    expect(formatDuration(null)).toBe('–');
    expect(formatRate(2712, 'tok/s')).toBe('2.7k tok/s');
    expect(formatRate(3.14, 'steps/s')).toBe('3.1 steps/s');
    expect(formatRate(null, 'tok/s')).toBe('');
  });
});
