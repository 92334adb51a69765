/** The JSON shapes the panel reads from the server extension and (through it) the backend. */

export interface IErrorBody {
  code: string;
  message: string;
  detail?: Record<string, unknown>;
}

/** How the server extension found its backend (`source` in its status). */
export interface IBackendSource {
  /** `config`: CortexServerApp.backend_url; `environment`: CORTEX_URL; `local`: the local backend's state file. */
  kind: 'config' | 'environment' | 'local';
  description: string;
  state_file: string | null;
  pid: number | null;
  /** Whether "Start local backend" may be offered (only when no backend is configured). */
  can_start_local: boolean;
}

export interface IStatus {
  /** null while no local backend runs. */
  backend_url: string | null;
  source: IBackendSource;
  extension: { version: string; api_version: string };
  backend: { service?: string; version?: string; api_version?: string } | null;
  reachable: boolean;
  authenticated: boolean;
  identity: { owner?: string; scopes?: string[] } | null;
  versions_match: boolean;
  api_compatible: boolean;
  error: IErrorBody | null;
}

export interface ISubJob {
  sub_job_id: string;
  type: string;
  status: string;
  base_model: string;
  lora?: { r?: number; alpha?: number; dropout?: number; target_modules?: string[] | null } | null;
  optimizer?: { lr?: number; weight_decay?: number } | null;
  seed?: number | null;
  max_seq_len?: number | null;
  device: string | null;
  failure_code: string | null;
  failure_message: string | null;
  /** What the worker reported when it started (engine, dtype, adapter), where it did. */
  info?: Record<string, unknown> | null;
}

/**
 * The backend's progress record of a job (GET /v1/jobs/{id} -> `progress`): the one place the training
 * numbers are computed; every view reads and labels them as named here, none recomputes them.
 * tests/test_contract_ts.py checks these keys against what the backend sends.
 */
export interface IProgressRecord {
  /** `managed`: the backend runs the loop of a `training_loop` spec; `primitive`: folded from a client's own loop. */
  source: 'managed' | 'primitive';
  phase: 'waiting' | 'training' | 'keep_alive' | 'finished' | 'stopped' | 'failed';
  step: number;
  /** null for primitive loops. */
  total_steps: number | null;
  /** The last step's summed loss divided by the sum of its loss weights. */
  loss_per_token: number | null;
  /** The last step's loss as the engine sums it. */
  summed_loss: number | null;
  eval_loss_per_token: number | null;
  eval_step: number | null;
  tokens: number;
  tokens_per_s: number | null;
  steps_per_s: number | null;
  elapsed_s: number | null;
  eta_s: number | null;
  last_checkpoint: string | null;
  /** The step `last_checkpoint` holds. */
  last_checkpoint_step: number | null;
  weight_version: number | null;
  /** At most 256 points, decimated by the backend. */
  history: Array<{ step: number; loss_per_token: number }>;
  eval_history: Array<{ step: number; eval_loss_per_token: number }>;
  samples: { step: number; items: Array<{ prompt: string; text: string }> } | null;
  /** Epoch seconds; pass as `after_progress` to long-poll for the next update. */
  updated_at: number;
}

/** Why a pending job waits. */
export interface IQueueInfo {
  position: number;
  reason: string;
  blocked_by: string[];
  /** Seconds until it may start; null when the backend cannot tell. */
  estimate_s: number | null;
}

/** A running job with nothing to do: the backend completes it (frees its device) at `frees_at`. */
export interface IIdleInfo {
  timeout_s: number;
  frees_at: number;
}

/** The `training_loop` of a managed run, as submitted (the `%%cortex train` spec's keys). */
export interface ITrainingLoop {
  batch_size?: number | null;
  max_seq_len?: number | null;
  steps?: number | null;
  epochs?: number | null;
  seed?: number | null;
  keep_alive_s?: number | null;
  [key: string]: unknown;
}

export interface IJob {
  job_id: string;
  owner: string;
  name: string | null;
  experiment: string | null;
  status: string;
  failure_code: string | null;
  failure_message: string | null;
  created_at: number;
  started_at: number | null;
  finished_at: number | null;
  last_activity_at?: number | null;
  idle_timeout_s?: number | null;
  /** Free-form key/value labels a client attached at creation. */
  labels?: Record<string, string> | null;
  sub_jobs: ISubJob[];
  training_loop?: ITrainingLoop | null;
  /** null when the job never trained. */
  progress: IProgressRecord | null;
  /** Only while pending. */
  queue: IQueueInfo | null;
  idle: IIdleInfo | null;
  keep_alive_until: number | null;
}

/** POST /v1/jobs/{id}/complete ("Free device"): the job, and the checkpoint saved first if any. */
export interface ICompletedJob extends IJob {
  saved_checkpoint: string | null;
}

export interface IDevice {
  id: string;
  kind: string;
  index: number | null;
  name: string;
  memory_bytes: number | null;
  slots: number;
  slots_in_use: number;
  slots_available: number;
  /** The engine sampling sub-jobs on this device run: "transformers" or "vllm" (absent from older backends). */
  sampler?: string;
  /** The machine the device is on (device ids of a cluster's hosts start with it). */
  host?: string;
}

/** A host's share of the capacity (a Ray backend's hosts; one row on a single host). */
export interface IHostCapacity {
  host: string;
  devices: string[];
  slots_total: number;
  slots_in_use: number;
  slots_available: number;
  /** The models registered on the host (Ray backends); absent where every model is served. */
  models?: string[];
}

export interface ICapacity {
  devices: IDevice[];
  slots_total: number;
  slots_in_use: number;
  slots_available: number;
  pending: number;
  pending_jobs?: Array<{ job_id: string; name: string | null; position: number; reason: string }>;
  hosts?: IHostCapacity[];
}

/** One monitor sample. GPU fields are absent (not zero) on hosts without a GPU. */
export interface IMetricSample {
  at: number;
  device?: string | null;
  gpu_utilization_percent?: number;
  gpu_memory_used_bytes?: number;
  gpu_memory_total_bytes?: number;
  gpu_temperature_c?: number;
  gpu_power_watts?: number;
  /** The host's CPU and RAM (all processes), not the job's. */
  cpu_percent?: number;
  ram_used_bytes?: number;
  ram_total_bytes?: number;
  /** The job's own worker processes (job metrics only; absent when the monitor could not read them). */
  job_cpu_percent?: number;
  job_ram_bytes?: number;
}

export interface IMetricsPage {
  samples: IMetricSample[];
  next_since?: number | null;
  /** The technical reason (NVML's error); views show `gpu_metrics_note` instead. */
  gpu_unavailable_reason?: string | null;
  /** One short line for views: "CPU host: no GPU metrics" on a host without NVIDIA GPUs, else what is wrong. */
  gpu_metrics_note?: string | null;
}

export interface ILogLine {
  seq: number;
  at: number;
  sub_job_id: string | null;
  stream: string;
  line: string;
}

export interface ILogPage {
  lines: ILogLine[];
  cursor: number;
  dropped?: number;
  job_status?: string;
}

export interface ICheckpoint {
  checkpoint_id: string;
  type: string;
  step: number | null;
  created_at: number;
  size_bytes: number | null;
}

export interface IRequestSummary {
  request_id?: string;
  id?: string;
  op: string;
  status: string;
  created_at: number;
  result: Record<string, unknown> | null;
}
