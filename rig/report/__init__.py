"""Layer 8, report: verdicts to files and tables (report.json, summary.md, JUnit, the matrix grid)."""
