/**
 * Backend paths from the generated route table (contract.ts), so the panel never spells a path itself.
 * Pure: no JupyterLab imports, unit-tested with jest.
 */
import { IRouteSpec, PROXIED_ROUTES } from './contract';

/** A route this panel wants is not served by the installed backend/extension (an older version). */
export class RouteUnavailableError extends Error {
  constructor(readonly routeName: string) {
    super(`the backend route '${routeName}' is not available in this version of cortex-nb`);
    this.name = 'RouteUnavailableError';
  }
}

export function findRoute(name: string): IRouteSpec | undefined {
  return Object.prototype.hasOwnProperty.call(PROXIED_ROUTES, name) ? PROXIED_ROUTES[name] : undefined;
}

export function hasRoute(name: string): boolean {
  return findRoute(name) !== undefined;
}

export type QueryValue = string | number | boolean | null | undefined;

/** The backend path for a route: placeholders filled (each value one encoded segment), plus a query. */
export function routePath(
  name: string,
  params: Record<string, string> = {},
  query: Record<string, QueryValue> = {}
): { method: IRouteSpec['method']; path: string } {
  const spec = findRoute(name);
  if (!spec) {
    throw new RouteUnavailableError(name);
  }
  const path = spec.template.replace(/\{(\w+)\}/g, (_, key: string) => {
    const value = params[key];
    if (value === undefined || value === '') {
      throw new Error(`route '${name}' needs a value for {${key}}`);
    }
    return encodeURIComponent(value);
  });
  const search = Object.entries(query)
    .filter(([, value]) => value !== undefined && value !== null && value !== '')
    .map(([key, value]) => `${encodeURIComponent(key)}=${encodeURIComponent(String(value))}`)
    .join('&');
  return { method: spec.method, path: search ? `${path}?${search}` : path };
}
