"""Live job views for notebooks. `state` (the bounded data a view shows) and `svg` (charts) import
nothing heavy; `job_widget` imports ipywidgets and is loaded only when a widget is shown."""
