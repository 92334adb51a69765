/**
 * The "loss per token" chart: training and eval curves from backend progress records (their bounded
 * `history` and `eval_history`), for one job or several overlaid. Nothing is recomputed here.
 */
import { formatLoss } from '../format';
import { IProgress } from '../types';
import { ISeries, lineChart } from './linechart';

/** Colour classes in order; a run keeps its colour for both its curves. */
export const SERIES_CLASSES = ['cortex-series-1', 'cortex-series-2', 'cortex-series-3', 'cortex-series-4',
  'cortex-series-5', 'cortex-series-6'];

export interface ILossCurves {
  label: string;
  progress: IProgress | null;
}

/** Train (solid) and eval (dashed) series for each record. */
export function lossSeries(curves: ILossCurves[]): ISeries[] {
  const series: ISeries[] = [];
  curves.forEach((curve, index) => {
    const className = SERIES_CLASSES[index % SERIES_CLASSES.length];
    const progress = curve.progress;
    const single = curves.length === 1;
    series.push({
      label: single ? 'train' : curve.label,
      points: (progress?.history ?? []).map(point => [point.step, point.loss_per_token] as [number, number]),
      className
    });
    series.push({
      label: single ? 'eval' : `${curve.label} eval`,
      points: (progress?.eval_history ?? []).map(point => [point.step, point.eval_loss_per_token] as [number, number]),
      // One job: eval gets its own colour and legend entry; several: each run's eval is dashed in its colour.
      className: single ? SERIES_CLASSES[1] : className,
      dashed: true,
      unlisted: !single
    });
  });
  return series;
}

export function lossChart(curves: ILossCurves[], options: { width?: number; height?: number } = {}): SVGSVGElement {
  return lineChart(lossSeries(curves), {
    title: 'loss per token',
    xLabel: 'step',
    format: formatLoss,
    empty: 'waiting for the first step',
    ...options
  });
}
