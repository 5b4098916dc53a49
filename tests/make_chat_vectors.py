#!/usr/bin/env python3
"""Render chat-format test vectors with the model's own Jinja chat template.

Writes tests/data/chat_vectors.json, read by tests/test_chat.c, so the C
implementation (lib/chat.c) is checked against the reference template and not
against anyone's reading of it.

The template is taken from tokenizer_config.json's "chat_template" when the
file has one.  The copy of tokenizer_config.json in this repository
(tests/data/model/, from /work/shared/model/) lacks that key, so the published
template of deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B is embedded below
verbatim (the revision whose generation prompt ends in "<think>\\n", matching
the model README).  Rendering follows transformers' apply_chat_template:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
loopcontrols extension, special tokens passed as variables.

Usage: python3 tests/make_chat_vectors.py [tokenizer_config.json] [out.json]
Needs: pip install jinja2
"""
import json
import os
import sys

from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))

# Published chat_template of deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B (the
# JSON string decoded; "\n" inside the Jinja string literals is Jinja's escape).
PUBLISHED_TEMPLATE = (
    r"""{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"""
    r"""{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}"""
    r"""{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}"""
    r"""{{bos_token}}{{ns.system_prompt}}"""
    r"""{%- for message in messages %}"""
    r"""{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}"""
    r"""{%- if message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}"""
    r"""{%- for tool in message['tool_calls']%}{%- if not ns.is_first %}"""
    r"""{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}"""
    r"""{%- set ns.is_first = true -%}{%- else %}"""
    r"""{{'\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}"""
    r"""{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{%- endif %}"""
    r"""{%- if message['role'] == 'assistant' and message['content'] is not none %}"""
    r"""{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}"""
    r"""{%- else %}{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"""
    r"""{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}"""
    r"""{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}"""
    r"""{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}"""
    r"""{%- else %}{{'\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}"""
    r"""{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}"""
    r"""{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\n'}}{% endif %}"""
)

S, U, A = "system", "user", "assistant"

CASES = [
    ("single_user_gen", [(U, "Hello, world!")], True),
    ("single_user_nogen", [(U, "Hello, world!")], False),
    ("empty_gen", [], True),
    ("empty_nogen", [], False),
    ("system_user_gen", [(S, "You are a helpful assistant."), (U, "What is 2+2?")], True),
    ("multi_turn_think_stripped",
     [(S, "Be brief."), (U, "What is 2+2?"),
      (A, "<think>\nThe user asks 2+2. That is 4.\n</think>\n\nIt is 4."),
      (U, "And 3+3?")], True),
    ("assistant_no_think", [(U, "Hi"), (A, "Hello! How can I help?"), (U, "Tell a joke")], True),
    ("assistant_two_think_ends",
     [(U, "q"), (A, "a</think>b</think>\n  final answer  ")], False),
    ("assistant_only_think_end", [(U, "q"), (A, "<think>all thought</think>")], True),
    ("assistant_open_think_only", [(U, "q"), (A, "<think>unfinished thought")], True),
    ("two_systems_last_wins",
     [(S, "first system"), (U, "u1"), (S, "second system"), (U, "u2")], True),
    ("system_only_nogen", [(S, "just a system prompt")], False),
    ("assistant_first", [(A, "I speak first"), (U, "ok")], True),
    ("user_think_kept", [(U, "keep <think>x</think> in user text")], True),
    ("unicode_and_newlines",
     [(S, "Réponds en français.\n"), (U, "Ça va ? 你好 🙂\nline two\n"),
      (A, "<think>\n思考\n</think>\n\nTrès bien, 谢谢!"), (U, "  spaces  ")], True),
    ("special_text_in_user", [(U, "<｜User｜>nested<｜Assistant｜>")], True),
    ("empty_contents", [(S, ""), (U, ""), (A, ""), (U, "")], True),
]


def main():
    cfg_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "data", "model",
                                                                  "tokenizer_config.json")
    out_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "data",
                                                                  "chat_vectors.json")
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    template = cfg.get("chat_template") or PUBLISHED_TEMPLATE
    source = "tokenizer_config.json" if cfg.get("chat_template") else \
        "published DeepSeek-R1-Distill-Qwen-1.5B template (embedded in make_chat_vectors.py)"

    def tok(name):
        v = cfg.get(name)
        return v.get("content") if isinstance(v, dict) else v

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    tmpl = env.from_string(template)
    cases = []
    for name, msgs, gen in CASES:
        messages = [{"role": r, "content": c} for r, c in msgs]
        text = tmpl.render(messages=messages, add_generation_prompt=gen,
                           bos_token=tok("bos_token"), eos_token=tok("eos_token"),
                           pad_token=tok("pad_token"), unk_token=tok("unk_token"))
        cases.append({"name": name, "messages": messages, "add_generation_prompt": gen,
                      "expected": text})
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"template_source": source, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {out_path} ({source})")


if __name__ == "__main__":
    main()
