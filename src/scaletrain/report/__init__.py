"""After a run: report.md with plots, and grouped findings from every worker log."""
