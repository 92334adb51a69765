/** How the panel writes numbers, sizes and times. Pure: no JupyterLab imports, unit-tested with jest. */
import { clock } from './contract';

// The widget's formats, generated from cortex_nb/protocol/states.py: one text for one number everywhere.
export { formatBytes, formatLoss, formatRate } from './contract';

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

/** A duration as the widget writes it (m:ss or h:mm:ss); "–" when unknown. */
export function formatDuration(seconds: number | null | undefined): string {
  return seconds === null || seconds === undefined || !Number.isFinite(seconds) ? '–' : clock(seconds);
}

