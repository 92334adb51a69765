"""A bounded chart series: the loss history the backend keeps per job and the curves a view draws.

Torch-free and widget-free, so the backend's progress record and the kernel's views decimate the
same way.
"""

from __future__ import annotations

CHART_POINTS = 256


class DecimatedSeries:
    """At most `capacity` (x, y) points. When full, neighbours merge pairwise (averaged) and later
    points are averaged over the doubled stride, so a long run keeps its shape in bounded memory.
    The very first point is kept as recorded."""

    def __init__(self, capacity: int = CHART_POINTS) -> None:
        self.capacity = max(4, capacity - capacity % 2)
        self.stride = 1
        self._points: list[tuple[float, float]] = []
        # The partial bucket as running sums (a list would grow with the stride).
        self._bucket_x = self._bucket_y = 0.0
        self._bucket_n = 0
        self.count = 0
        self.first: tuple[float, float] | None = None
        self.last: tuple[float, float] | None = None

    def append(self, x: float, y: float) -> None:
        self.count += 1
        self.first = self.first or (x, y)
        self.last = (x, y)
        self._bucket_x += x
        self._bucket_y += y
        self._bucket_n += 1
        if self._bucket_n >= self.stride:
            self._points.append(self._bucket_mean())
            self._bucket_x = self._bucket_y = 0.0
            self._bucket_n = 0
        if len(self._points) >= self.capacity:
            # The first point stays as it was: where a curve starts (the initial loss) matters most.
            head, rest = self._points[0], self._points[1:]
            self._points = [head] + [_mean(rest[i : i + 2]) for i in range(0, len(rest), 2)]
            self.stride *= 2

    def _bucket_mean(self) -> tuple[float, float]:
        return (self._bucket_x / self._bucket_n, self._bucket_y / self._bucket_n)

    def points(self) -> list[tuple[float, float]]:
        """The retained points, plus the partial bucket so the newest value always shows."""
        return self._points + ([self._bucket_mean()] if self._bucket_n else [])

    def __len__(self) -> int:
        """Points held (the partial bucket counts as one: it is two sums and a count)."""
        return len(self._points) + (1 if self._bucket_n else 0)


def _mean(points: list[tuple[float, float]]) -> tuple[float, float]:
    return (sum(p[0] for p in points) / len(points), sum(p[1] for p in points) / len(points))
