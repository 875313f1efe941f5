"""Layer 7, judge: observations to a verdict: tri-state checks, known-issue signatures, the one verdict
engine (PASS/FAIL/XFAIL/XPASS/ERROR), the early livelock verdict, fault recovery checks."""
