"""The page model: what each report page shows, computed once from the analysis records.

Between the analysis layers (results rows, the snapshot replay, attribution) and
``render/`` (which only turns these records into a medium): the sweep report's page
(:mod:`~memprobe.report.page`), the attribute page's headline and OOM summary
(:mod:`~memprobe.report.attribution`). Nothing here draws or writes HTML.
"""
