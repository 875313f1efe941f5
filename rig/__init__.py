"""pdrig: an end-to-end test rig for disaggregated prefill/decode (P/D) serving with vLLM.

Data flows one way, one module per step:
config -> plan -> cluster -> workload -> observations -> verdict -> report.
"""

__version__ = "0.1.0"
