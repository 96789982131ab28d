"""Curation, with the ETL it serves: the curation stage (``curate.py``: quality filters, the score
filter, exact and near deduplication, on whole documents), its document keys (``documents.py``) and
per-document kernels (``minhash.py``, ``quality.py``), and the contamination check after encoding
(``contamination.py``, its n-gram kernels in ``ngrams.py``). No module is imported here: importing
one runs this file, which must not import it back."""
