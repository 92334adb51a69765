/** How the panel writes numbers, sizes and times. Pure: no JupyterLab imports, unit-tested with jest. */
import { clock } from './contract';

/** "12s", "5m", "3h", "2d": how long ago `thenS` (epoch seconds) was, as of `nowS`. */
export function formatAge(thenS: number, nowS: number): string {
  const seconds = Math.max(0, Math.floor(nowS - thenS));
  if (seconds < 60) {
    return `${seconds}s`;
  }
  if (seconds < 3600) {
    return `${Math.floor(seconds / 60)}m`;
  }
  if (seconds < 86400) {
    return `${Math.floor(seconds / 3600)}h`;
  }
  return `${Math.floor(seconds / 86400)}d`;
}

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

/** A loss with four significant digits ("1.234", "0.0002457"); "–" when there is none. */
export function formatLoss(value: number | null | undefined): string {
  if (value === null || value === undefined || !Number.isFinite(value)) {
    return '–';
  }
  return Number(value.toPrecision(4)).toString();
}

/** A duration as the widget writes it (m:ss or h:mm:ss); "–" when unknown. */
export function formatDuration(seconds: number | null | undefined): string {
  return seconds === null || seconds === undefined || !Number.isFinite(seconds) ? '–' : clock(seconds);
}

/** A rate with a unit: "2.7k tok/s", "3.1 steps/s". */
export function formatRate(value: number | null | undefined, unit: string): string {
  if (value === null || value === undefined || !Number.isFinite(value)) {
    return '';
  }
  return value >= 1000 ? `${(value / 1000).toFixed(1)}k ${unit}` : `${value >= 10 ? value.toFixed(0) : value.toFixed(1)} ${unit}`;
}
