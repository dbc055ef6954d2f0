"""vLLM's HiSparse configurations on two kvcoord cores (a host core and a
device core): the manager, its pool views and the views vLLM's
``HiSparseCoordinator`` runs over. Built on :mod:`kvcoord.vllm.serve`,
which decides which HiSparse configurations are served
(``serve._hisparse_support``); see docs/hisparse.md.
"""
