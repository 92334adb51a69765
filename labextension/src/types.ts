/** The JSON shapes the panel reads from the server extension and (through it) the backend. */

export interface IErrorBody {
  code: string;
  message: string;
  detail?: Record<string, unknown>;
}

export interface IStatus {
  backend_url: string;
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
  device: string | null;
  failure_code: string | null;
  failure_message: string | null;
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
  sub_jobs: ISubJob[];
  /** Reported by backends that know a job's planned length. */
  progress?: { step?: number; total_steps?: number } | null;
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
  cpu_percent?: number;
  ram_used_bytes?: number;
  ram_total_bytes?: number;
}

export interface IMetricsPage {
  samples: IMetricSample[];
  next_since?: number | null;
  gpu_unavailable_reason?: string | null;
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
