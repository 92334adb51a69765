/**
 * The left-sidebar panel: connection, devices, the job filter, jobs, finished trainings and checkpoint
 * storage, re-rendered whenever the model changes (and each second while a countdown shows).
 */
import { Widget } from '@lumino/widgets';

import { h, replaceChildren } from '../dom';
import { PanelModel } from '../model';
import { renderConnection } from './connection';
import { renderDevices } from './devices';
import { lineageSummary } from '../storage';
import { filterBar } from './filterbar';
import { renderJobs } from './jobs';
import { IJobRowActions } from './rowactions';
import { renderStorage } from './storage';
import { renderTrainings } from './trainings';

export interface ISidebarActions extends IJobRowActions {
  openJob: (jobId: string) => void;
  refresh: () => void;
  startLocal: () => void;
  compare: (jobIds: string[]) => void;
  /** Open or close a job's checkpoints in the storage section (and fetch its lineage). */
  toggleStorageJob: (jobId: string) => void;
  keepCheckpoint: (jobId: string, checkpointId: string, kept: boolean) => void;
  pruneAllButFinal: (jobId: string) => void;
  pruneOlderThan: (jobId: string) => void;
}

export class CortexSidebar extends Widget {
  private _unsubscribe: () => void;
  private _body = h('div', { class: 'cortex-sidebar-body' });
  private _ticker: number;
  private _markup = '';

  constructor(
    readonly model: PanelModel,
    private readonly _actions: ISidebarActions
  ) {
    super();
    this.id = 'cortex-nb-sidebar';
    this.addClass('cortex-sidebar');
    const refresh = h('button', { class: 'jp-Button cortex-button', title: 'Refresh now (Cortex: Refresh)' }, 'Refresh');
    refresh.addEventListener('click', () => this._actions.refresh());
    this.node.appendChild(h('header', { class: 'cortex-sidebar-header' }, h('h2', {}, 'Cortex'), refresh));
    // Outside the re-rendered body: typing in the filter keeps its focus.
    this.node.appendChild(filterBar(model));
    this.node.appendChild(this._body);
    this._unsubscribe = model.onChange(() => this.render());
    // Countdowns ("freeing the device in 4:32") move on between polls.
    this._ticker = window.setInterval(() => {
      if (this.isVisible && this.model.hasCountdown) {
        this.render();
      }
    }, 1000);
    this.render();
  }

  render(): void {
    const model = this.model;
    const state = model.state;
    const now = Date.now() / 1000;
    const sections = [
      renderConnection({
        state: model.connection,
        status: state.status,
        warnings: model.warnings,
        error: state.error,
        startingLocal: state.startingLocal,
        startError: state.startError,
        startLocal: this._actions.startLocal
      }),
      renderDevices(model.devices(), state.gpuMetricsNote, model.hosts(), model.weekUsage()),
      renderJobs(model.jobRows(now), this._actions.openJob, this._actions, state.filter.text.trim() !== ''),
      renderTrainings({
        trainings: model.finishedTrainings(now),
        selection: state.compareSelection,
        toggle: jobId => model.toggleCompare(jobId),
        openJob: this._actions.openJob,
        compare: this._actions.compare,
        actions: this._actions
      }),
      renderStorage({
        meters: model.storageMeters(),
        jobs: model.storageJobs(),
        openJob: state.storageJob,
        summary: state.lineage && state.lineage.job_id === state.storageJob ? lineageSummary(state.lineage) : '',
        checkpoints: model.storageCheckpoints(),
        note: state.storageNote,
        toggleJob: this._actions.toggleStorageJob,
        keep: this._actions.keepCheckpoint,
        pruneAllButFinal: this._actions.pruneAllButFinal,
        pruneOlderThan: this._actions.pruneOlderThan
      })
    ];
    // Only touch the page when something shows differently: a node replaced under the pointer would
    // swallow a click, and most polls change nothing.
    const markup = sections.map(section => section.outerHTML).join('');
    if (markup !== this._markup) {
      this._markup = markup;
      replaceChildren(this._body, ...sections);
    }
  }

  dispose(): void {
    window.clearInterval(this._ticker);
    this._unsubscribe();
    super.dispose();
  }
}
