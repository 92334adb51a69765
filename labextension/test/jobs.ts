/** Job JSON as the backend sends it, for the panel's unit tests. */
import { IJobView, IProgress } from '../src/types';

export function progress(overrides: Partial<IProgress> = {}): IProgress {
  return {
    source: 'managed',
    phase: 'training',
    step: 42,
    total_steps: 80,
    loss_per_token: 1.2345678,
    summed_loss: 987.6,
    eval_loss_per_token: 1.5,
    eval_step: 40,
    tokens: 43008,
    tokens_per_s: 2100,
    steps_per_s: 2.1,
    elapsed_s: 20,
    eta_s: 18.1,
    last_checkpoint: null,
    last_checkpoint_step: null,
    weight_version: 42,
    history: [{ step: 1, loss_per_token: 8.6 }, { step: 42, loss_per_token: 1.2345678 }],
    eval_history: [{ step: 20, eval_loss_per_token: 2.0 }, { step: 40, eval_loss_per_token: 1.5 }],
    samples: null,
    updated_at: 1764567890.1,
    ...overrides
  };
}

export function job(overrides: Partial<IJobView> = {}): IJobView {
  return {
    job_id: 'job-1',
    owner: 'alice',
    name: null,
    experiment: null,
    status: 'running',
    failure_code: null,
    failure_message: null,
    created_at: 1000,
    started_at: 1001,
    finished_at: null,
    last_activity_at: null,
    idle_timeout_s: null,
    labels: {},
    sub_jobs: [
      { sub_job_id: 'training-0', type: 'training', status: 'running', base_model: 'tiny', device: 'cpu',
        lora: { r: 16, alpha: 32 }, optimizer: { lr: 0.003 }, seed: 0, max_seq_len: 128,
        failure_code: null, failure_message: null, info: null }
    ],
    training_loop: null,
    progress: null,
    queue: null,
    idle: null,
    keep_alive_until: null,
    ...overrides
  };
}
