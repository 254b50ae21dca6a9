"""sentence-transformers' `SentenceTransformer` calls, as a class over minisbert's SentenceModel, so
that a porting user's code runs with the import changed.

SentenceModel (encoding/model.py) is the network: tokenize, encode, pool, save, load. What exists only to
behave as sentence-transformers does is here, over it:

- the constructor's truncate_dim, prompts, default_prompt_name and similarity_fn_name, read from and
  saved to config_sentence_transformers.json (encoding/st_directory.py);
- encode()'s prompt and prompt_name (porting/prompts.py), precision (porting/quantize.py), truncate_dim and
  output_value="token_embeddings", and encode_query / encode_document;
- similarity and similarity_pairwise (common/similarity.py), get_sentence_embedding_dimension;
- refusing by name what minisbert does not do, attribute or encode() argument (porting/refused.py).

`minisbert.load` and `minisbert.SentenceTransformer` return this class. Checked against
sentence-transformers 6.2 in tests/porting/test_st_calls.py.
"""

from pathlib import Path

import torch

from ..encoding.model import SentenceModel, convert_output, write_model_dir
from ..encoding.pooling import normalize
from .refused import check_output, checked_truncate_dim, refuse_attribute, refuse_encode_arguments
from .prompts import QUERY_PROMPT_NAME, check_default_prompt_name, document_prompt_name, model_prompts, resolve_prompt
from .quantize import quantize_embeddings
from ..common.similarity import check_similarity_function, similarity, similarity_pairwise
from ..encoding.st_directory import read_st_config, write_layout


class SentenceTransformer(SentenceModel):
    def __init__(self, *network, similarity_fn_name: str = "cosine", truncate_dim: int | None = None,
                 prompts: dict | None = None, default_prompt_name: str | None = None, **network_options):
        """network, network_options: SentenceModel's arguments (encoder, tokenizer, pooling, ...). Built
        in memory it runs the fast path `minisbert.load` plugs in (minisbert.default_fast_path()), as
        sentence-transformers' class runs its one path, so it gives the very bits of the same model saved
        and loaded; fast_path=None runs the plain network alone."""
        if "fast_path" not in network_options:
            from ..encoding.backend import default_fast_path  # fast/ is imported here, only for the default

            network_options["fast_path"] = default_fast_path()
        super().__init__(*network, **network_options)
        self.similarity_fn_name = similarity_fn_name  # how `similarity` compares embeddings
        self.truncate_dim = truncate_dim  # keep the first truncate_dim dimensions of each embedding (None: all)
        self.prompts = model_prompts(prompts, {})  # prompt name -> text put before an input (porting/prompts.py)
        check_default_prompt_name(self.prompts, default_prompt_name)
        self.default_prompt_name = default_prompt_name  # the prompt encode() uses when told none

    def __setattr__(self, name, value):
        refuse_attribute(name)  # a sentence-transformers attribute minisbert would ignore (porting/refused.py)
        if name == "similarity_fn_name":
            check_similarity_function(value, "similarity_fn_name")
        super().__setattr__(name, value)

    def get_sentence_embedding_dimension(self) -> int:
        """The size of what encode() returns: the model's, or truncate_dim where that is smaller."""
        return self.dimension if self.truncate_dim is None else min(self.dimension, self.truncate_dim)

    get_embedding_dimension = get_sentence_embedding_dimension  # sentence-transformers 6.2's newer name

    @torch.inference_mode()
    def encode(self, sentences, batch_size: int = 32, show_progress_bar: bool = None,
               convert_to_numpy: bool = True, convert_to_tensor: bool = False,
               normalize_embeddings: bool = False, dtype: str = "float32", fast: bool = None, *,
               prompt_name: str = None, prompt: str = None, output_value: str = "sentence_embedding",
               precision: str = "float32", truncate_dim: int = None, **unsupported):
        """SentenceModel.encode with sentence-transformers' other arguments:

        prompt / prompt_name: a text put before each sentence, or the name of one in `self.prompts`;
        neither: the one named by `self.default_prompt_name`, if any (porting/prompts.py).
        output_value: "sentence_embedding", or "token_embeddings": per text a (T_i, H) tensor of its
        tokens' vectors from the encoder (padding left out).
        precision: float32 (or None), or int8, uint8, binary, ubinary (porting/quantize.py; int8/uint8 take each
        dimension's range from the embeddings themselves, so encode at least two texts).
        truncate_dim: keep the first truncate_dim dimensions (None: the model's truncate_dim), before
        normalize_embeddings.
        """
        refuse_encode_arguments(unsupported)
        precision = "float32" if precision is None else precision  # as sentence-transformers reads None
        check_output(output_value, precision, normalize_embeddings, truncate_dim)
        truncate_dim = checked_truncate_dim(self.truncate_dim if truncate_dim is None else truncate_dim)
        prompt = resolve_prompt(self.prompts, self.default_prompt_name, prompt, prompt_name)
        one_sentence = isinstance(sentences, str)
        if prompt:
            prompted = [prompt + text for text in self.tokenizer.text_list([sentences] if one_sentence else sentences)]
            sentences = prompted[0] if one_sentence else prompted
        if output_value == "token_embeddings":
            return self.token_embeddings(sentences, batch_size, show_progress_bar, dtype, fast)
        if truncate_dim is None and precision == "float32":
            return super().encode(sentences, batch_size, show_progress_bar, convert_to_numpy, convert_to_tensor,
                                  normalize_embeddings, dtype, fast)
        embeddings = super().encode([sentences] if one_sentence else sentences, batch_size, show_progress_bar,
                                    convert_to_tensor=True, dtype=dtype, fast=fast)[:, :truncate_dim]  # (n, D)
        if normalize_embeddings:
            embeddings = normalize(embeddings)
        if not convert_to_tensor:
            embeddings = embeddings.cpu()
        if precision != "float32":
            embeddings = torch.from_numpy(quantize_embeddings(embeddings, precision))
        return convert_output(embeddings, one_sentence, convert_to_numpy, convert_to_tensor)

    def token_embeddings(self, sentences, batch_size: int, show_progress_bar, dtype: str, fast) -> list:
        """Per text a (T_i, H) tensor of the encoder's vectors of its tokens (padding left out); for
        one str, its tensor alone."""
        one_sentence = isinstance(sentences, str)
        id_lists = self.tokenizer.token_ids([sentences] if one_sentence else sentences)
        tokens = [None] * len(id_lists)
        for rows, batch in self.batches(id_lists, batch_size, show_progress_bar, dtype, fast):
            for row, vectors in zip(rows, self.forward_tokens(batch, fast).float()):  # (T, H) each
                tokens[row] = vectors[:len(id_lists[row])]
        return tokens[0] if one_sentence else tokens

    def encode_query(self, sentences, **options):
        """encode() with the model's "query" prompt, unless told another (sentence-transformers' name)."""
        if options.get("prompt") is None and options.get("prompt_name") is None:
            options["prompt_name"] = QUERY_PROMPT_NAME if QUERY_PROMPT_NAME in self.prompts else None
        return self.encode(sentences, **options)

    def encode_document(self, sentences, **options):
        """encode() with the model's "document", "passage" or "corpus" prompt, the first it has."""
        if options.get("prompt") is None and options.get("prompt_name") is None:
            options["prompt_name"] = document_prompt_name(self.prompts)
        return self.encode(sentences, **options)

    def similarity(self, a, b) -> torch.Tensor:
        """(n, m) similarities of embeddings a (n, D) to b (m, D) by the model's similarity function
        (`similarity_fn_name`: cosine unless the model directory names another; common/similarity.py)."""
        return similarity(a, b, self.similarity_fn_name)

    def similarity_pairwise(self, a, b) -> torch.Tensor:
        """(n,) similarities of a_i to b_i, for embeddings a and b (n, D), by `similarity_fn_name`."""
        return similarity_pairwise(a, b, self.similarity_fn_name)

    def save(self, path) -> None:
        """SentenceModel.save, with the similarity function and the prompts in config_sentence_transformers.json."""
        settings = {"similarity_fn_name": self.similarity_fn_name, "prompts": self.prompts,
                    "default_prompt_name": self.default_prompt_name}
        if self.truncate_dim is not None:  # as sentence-transformers writes it: only where set
            settings["truncate_dim"] = self.truncate_dim
        write_model_dir(path, lambda folder: write_layout(folder, self, settings))

    @classmethod
    def from_dir(cls, model_dir, device=None, fast_path=None, truncate_dim: int | None = None,
                 prompts: dict | None = None, default_prompt_name: str | None = None,
                 similarity_fn_name: str | None = None) -> "SentenceTransformer":
        """SentenceModel.from_dir, with sentence-transformers' constructor arguments: truncate_dim,
        prompts, default_prompt_name and similarity_fn_name given here win over the directory's."""
        model = super().from_dir(model_dir, device, fast_path)
        saved_similarity, saved_prompts, saved_default, saved_truncate_dim = read_st_config(Path(model_dir))
        model.similarity_fn_name = similarity_fn_name if similarity_fn_name is not None else saved_similarity
        model.truncate_dim = checked_truncate_dim(truncate_dim if truncate_dim is not None else saved_truncate_dim)
        model.prompts = model_prompts(prompts, saved_prompts)
        default_prompt_name = default_prompt_name if default_prompt_name is not None else saved_default
        check_default_prompt_name(model.prompts, default_prompt_name)
        model.default_prompt_name = default_prompt_name
        return model
