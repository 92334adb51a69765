/** The left-sidebar panel: connection, devices and jobs, re-rendered whenever the model changes. */
import { Widget } from '@lumino/widgets';

import { h, replaceChildren } from '../dom';
import { PanelModel } from '../model';
import { renderConnection } from './connection';
import { renderDevices } from './devices';
import { renderJobs } from './jobs';

export class CortexSidebar extends Widget {
  private _unsubscribe: () => void;
  private _body = h('div', { class: 'cortex-sidebar-body' });

  constructor(
    readonly model: PanelModel,
    private readonly _openJob: (jobId: string) => void,
    private readonly _refresh: () => void
  ) {
    super();
    this.id = 'cortex-nb-sidebar';
    this.addClass('cortex-sidebar');
    const refresh = h('button', { class: 'jp-Button cortex-button', title: 'Refresh now (Cortex: Refresh)' }, 'Refresh');
    refresh.addEventListener('click', () => this._refresh());
    this.node.appendChild(h('header', { class: 'cortex-sidebar-header' }, h('h2', {}, 'Cortex'), refresh));
    this.node.appendChild(this._body);
    this._unsubscribe = model.onChange(() => this.render());
    this.render();
  }

  render(): void {
    const model = this.model;
    const state = model.state;
    replaceChildren(
      this._body,
      renderConnection(model.connection, state.status, model.warnings, state.error),
      renderDevices(model.devices(), state.gpuUnavailableReason, model.hosts()),
      renderJobs(model.jobRows(Date.now() / 1000), this._openJob)
    );
  }

  dispose(): void {
    this._unsubscribe();
    super.dispose();
  }
}
