import { LabIcon } from '@jupyterlab/ui-components';

/** A chip with a pulse line; fills with the theme's icon colour so dark themes work. */
const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M7 3h2v2h2V3h2v2h2V3h2v2h2v2h2v2h-2v2h2v2h-2v2h2v2h-2v2h-2v2h-2v-2h-2v2h-2v-2H9v2H7v-2H5v-2H3v-2h2v-2H3V9h2V7H3V5h2V3h2zm0 4v10h10V7H7z"/>
    <path d="M8 13h2l1-3 2 6 1-3h2v1.5h-1l-2 4-2-6-.5 1.5H8z"/>
  </g>
</svg>`;

export const cortexIcon = new LabIcon({ name: 'cortex-nb:icon', svgstr: svg });
