"""N-gram language model over BPE token ids: interpolated modified Kneser-Ney, add-k, stupid backoff.

One module a job: `counts` (keys packed 16 bits a token, raw and Kneser-Ney counts, discounts), `model` (NGramLM:
fit, score, save, load memory-mapped), `lookup` (searching the memory-mapped tables a stretch at a time) and
`arpa` (the export KenLM and SRILM load). The out-of-core build of the same tables is lmpipe.ngram_build.
"""

from lmpipe.ngram.arpa import arpa_counts, write_arpa
from lmpipe.ngram.counts import TABLE_FIELDS, OrderTable
from lmpipe.ngram.model import NGramLM, perplexity

__all__ = ["NGramLM", "OrderTable", "TABLE_FIELDS", "arpa_counts", "perplexity", "write_arpa"]
