/** A dependency-free SVG line chart: one or more series against time or step, axes labelled with min/max. */

const SVG = 'http://www.w3.org/2000/svg';

export interface ISeries {
  label: string;
  points: Array<[number, number]>;
  /** CSS class that sets the stroke colour from JupyterLab's theme variables. */
  className: string;
  /** Drawn dashed (eval curves next to their training curve). */
  dashed?: boolean;
  /** Left out of the legend (a run's eval curve, when the legend names runs). */
  unlisted?: boolean;
}

export interface IChartOptions {
  title: string;
  unit?: string;
  width?: number;
  height?: number;
  /** Fixed y range, e.g. [0, 100] for percentages; otherwise from the data. */
  yRange?: [number, number];
  format?: (value: number) => string;
  /** Label the x axis with its first and last value (e.g. steps) and this name under it. */
  xLabel?: string;
  xFormat?: (value: number) => string;
  /** Text shown when there are no points. */
  empty?: string;
}

function svg<K extends keyof SVGElementTagNameMap>(tag: K, attributes: Record<string, string | number>): SVGElementTagNameMap[K] {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) {
    element.setAttribute(name, String(value));
  }
  return element;
}

export function lineChart(series: ISeries[], options: IChartOptions): SVGSVGElement {
  const width = options.width ?? 420;
  const height = options.height ?? 140;
  const pad = { left: 44, right: 8, top: 18, bottom: options.xLabel ? 28 : 16 };
  const root = svg('svg', { class: 'cortex-chart', viewBox: `0 0 ${width} ${height}`, role: 'img' });
  root.setAttribute('aria-label', options.title);
  const title = svg('text', { x: pad.left, y: 12, class: 'cortex-chart-title' });
  title.textContent = options.title;
  root.appendChild(title);

  const all = series.flatMap(s => s.points);
  if (!all.length) {
    const empty = svg('text', { x: width / 2, y: height / 2, 'text-anchor': 'middle', class: 'cortex-chart-empty' });
    empty.textContent = options.empty ?? 'no samples yet';
    root.appendChild(empty);
    return root;
  }
  const xs = all.map(p => p[0]);
  const ys = all.map(p => p[1]);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = options.yRange ?? [Math.min(0, ...ys), Math.max(...ys)];
  if (!Number.isFinite(y0) || !Number.isFinite(y1)) {
    [y0, y1] = [0, 1];
  }
  if (y1 <= y0) {
    y1 = y0 + 1;
  }
  const sx = (x: number): number => pad.left + ((x - x0) / (x1 - x0 || 1)) * (width - pad.left - pad.right);
  const sy = (y: number): number => height - pad.bottom - ((y - y0) / (y1 - y0)) * (height - pad.top - pad.bottom);
  const format = options.format ?? ((v: number) => `${Math.round(v)}${options.unit ?? ''}`);

  root.appendChild(svg('line', { x1: pad.left, y1: sy(y0), x2: width - pad.right, y2: sy(y0), class: 'cortex-chart-axis' }));
  root.appendChild(svg('line', { x1: pad.left, y1: pad.top, x2: pad.left, y2: sy(y0), class: 'cortex-chart-axis' }));
  for (const [value, y] of [[y1, pad.top + 4], [y0, sy(y0)]] as Array<[number, number]>) {
    const tick = svg('text', { x: pad.left - 4, y, 'text-anchor': 'end', class: 'cortex-chart-tick' });
    tick.textContent = format(value);
    root.appendChild(tick);
  }
  if (options.xLabel) {
    const xFormat = options.xFormat ?? ((v: number) => String(Math.round(v)));
    const bottom = height - pad.bottom;
    for (const [value, anchor] of [[x0, 'start'], [x1, 'end']] as Array<[number, string]>) {
      const tick = svg('text', { x: sx(value), y: bottom + 11, 'text-anchor': anchor, class: 'cortex-chart-tick' });
      tick.textContent = xFormat(value);
      root.appendChild(tick);
    }
    const label = svg('text', { x: (pad.left + width - pad.right) / 2, y: height - 3, 'text-anchor': 'middle', class: 'cortex-chart-tick' });
    label.textContent = options.xLabel;
    root.appendChild(label);
  }
  let legendX = width - pad.right;
  for (const one of [...series].reverse()) {
    if (!one.points.length) {
      continue;
    }
    const path = one.points.map((p, i) => `${i ? 'L' : 'M'}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(' ');
    const line = svg('path', { d: path, class: `cortex-chart-line ${one.className}${one.dashed ? ' cortex-chart-dashed' : ''}` });
    line.setAttribute('data-series', one.label);
    root.appendChild(line);
    if (one.unlisted) {
      continue;
    }
    const legend = svg('text', { x: legendX, y: 12, 'text-anchor': 'end', class: `cortex-chart-legend ${one.className}` });
    legend.textContent = one.label;
    root.appendChild(legend);
    legendX -= 8 + one.label.length * 6.5;
  }
  return root;
}
