"""word2vec stage: a gensim Word2Vec of the training split, the audit's classic reference embedding."""

from lmpipe.blas import pin_kernel

pin_kernel()  # before NumPy loads: the same BLAS kernels, so the same bytes, on every CPU of a kind

import zlib

from prefect import flow, task

from lmpipe import paths
from flows._stage import PARAMS_FILE, main, stage_run
from lmpipe import tracking
from lmpipe.config import load_params
from lmpipe.io import atomic_path

TRAIN, OUT_DIR = paths.TRAIN_TEXT, paths.WORD2VEC


def stable_hash(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


@task
def train_word2vec(params) -> dict:
    from gensim.models import Word2Vec

    from lmpipe.audit import WORD

    sentences = [WORD.findall(line) for line in open(TRAIN, encoding="utf-8") if line.strip()]
    # one worker, a fixed seed and a hash that does not change per process (gensim seeds each word's
    # initial vector with hash(word + seed); Python's own str hash is salted per process)
    model = Word2Vec(sentences, vector_size=params.vector_size, window=params.window, min_count=params.min_count,
                     epochs=params.epochs, sg=params.sg, seed=params.seed, workers=1, hashfxn=stable_hash)
    with atomic_path(OUT_DIR) as tmp:
        tmp.mkdir()
        # the word2vec binary format: vectors and words alone, the same bytes from the same training (gensim's own
        # .save pickles a log of timestamped events with them)
        model.wv.save_word2vec_format(str(tmp / "word2vec.bin"), binary=True)
    return {"vocab_size": len(model.wv), "vector_size": params.vector_size}


@flow(name="word2vec")
def word2vec() -> dict:
    params = load_params(PARAMS_FILE)
    with stage_run("word2vec", params, {"audit.word2vec": params.audit.word2vec.model_dump()}, model="word2vec"):
        info = train_word2vec(params.audit.word2vec)
        tracking.mark_output(OUT_DIR)
        tracking.log_metrics(info)
    return info


if __name__ == "__main__":
    main(word2vec)
