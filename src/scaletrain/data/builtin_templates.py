"""The built-in chat templates' Jinja sources, with ``{% generation %}`` marks on each assistant part (templates.py
resolves and renders them).

Built-ins reproduce the model's own ``chat_template`` token for token (tested against the real strings in
tests/fixtures/chat_templates, whose SOURCES.md names where each comes from), with ``{% generation %}`` marks:
- ``qwen``: Qwen2.5-Instruct (ChatML, default system "You are Qwen, created by Alibaba Cloud. ...", tools in the
  system prompt, ``<tool_call>`` blocks, results as ``<tool_response>`` in a user turn).
- ``qwen2``: Qwen2-Instruct (ChatML, default system "You are a helpful assistant."; no tool format).
- ``qwen3``: Qwen3's thinking format (Qwen3-4B-Thinking-2507): reasoning written for the turns after the last user
  query and dropped before it, tools as Qwen2.5 writes them. ``qwen3_nothink``: Qwen3-Instruct-2507 (the same, but
  its generation prompt opens no ``<think>`` block).
- ``chatml``: bare ChatML (``<|im_start|>{role}\\n{content}<|im_end|>\\n``), no default system prompt.
- ``llama3``: Meta-Llama-3-Instruct. ``llama3.1``: Llama-3.1-Instruct (its "Cutting Knowledge Date" header, tools
  in the first user message, one JSON call per message, results in ``ipython`` turns).
- ``mistral``: Mistral-7B-Instruct-v0.3 (``[INST] q[/INST] a</s>``, ``[AVAILABLE_TOOLS]``, ``[TOOL_CALLS]``,
  ``[TOOL_RESULTS]``); the system prompt goes into the last user message, where the model's own template puts it
  when the model answers (its template drops it from a conversation that ends with a reply).
  ``mistral_v1``: v0.1's spacing (``[INST] q [/INST]a</s>``).
- ``gemma`` / ``gemma3``: gemma-2-it and gemma-3-it (one format): the system prompt opens the first user turn, as
  gemma-3-it's own template writes it (gemma-2-it's raises "System role not supported"; LLaMA-Factory folds it so).
- ``deepseek_r1``: DeepSeek-R1 and its distills; the last turn's reasoning trained, earlier turns' dropped (as
  the model's own template writes the history).
- ``gpt_oss``: gpt-oss's harmony format (channels, the developer message, TypeScript tool declarations, one call
  per message; the reasoning of the last turn kept, as the model's template keeps it).
- ``alpaca``: Stanford Alpaca's prompt (tatsu-lab/stanford_alpaca, README "prompt"). ``vicuna``: FastChat's
  vicuna_v1.1.
"""

from __future__ import annotations

_GEN = "{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"

QWEN2_SYSTEM = "You are a helpful assistant."
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
# Qwen2.5's tool preamble and its call format, as its tokenizer_config.json writes them.
_QWEN_TOOLS_HEAD = ("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
                    "provided with function signatures within <tools></tools> XML tags:\n<tools>")
_QWEN_TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                    "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                    "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n")
# Llama 3.1's tool preamble (tools in the first user message, its default) and its fixed date header.
_LLAMA31_TOOLS = ("Given the following functions, please respond with a JSON for a function call with its proper "
                  "arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
                  "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n")
_LLAMA31_DATE = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"


def _q(text: str) -> str:
    """A Python string as a Jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def _chatml(default_system: str | None, tools: bool) -> str:
    """ChatML as Qwen writes it: an optional default system prompt, Qwen2.5's tool preamble, <tool_call> blocks
    for an assistant's calls and tool results in one user turn of <tool_response> blocks."""
    system = ("{% if messages and messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
              "{% set messages = messages[1:] %}{% else %}{% set system = none %}{% endif %}")
    if default_system is not None:
        fallback = "{% if system is none %}{% set system = " + _q(default_system) + " %}{% endif %}"
    else:
        fallback = ""
    head = ("{% if tools %}{{ '<|im_start|>system\\n' + (system or '') + " + _q(_QWEN_TOOLS_HEAD) + " }}"
            "{% for tool in tools %}{{ '\\n' + tool | tojson }}{% endfor %}{{ " + _q(_QWEN_TOOLS_TAIL) + " }}"
            "{% elif system is not none %}{{ '<|im_start|>system\\n' + system + '<|im_end|>\\n' }}{% endif %}"
            if tools else
            "{% if system is not none %}{{ '<|im_start|>system\\n' + system + '<|im_end|>\\n' }}{% endif %}")
    calls = ("{% for call in message['tool_calls'] or [] %}{% set f = call['function'] %}"
             "{{ ('\\n' if (message['content'] or not loop.first) else '') + '<tool_call>\\n{\"name\": \"' + f['name']"
             " + '\", \"arguments\": ' + f['arguments'] | tojson + '}\\n</tool_call>' }}{% endfor %}") if tools else ""
    tool_turn = ("{% elif message['role'] == 'tool' %}"
                 "{% if loop.first or loop.previtem['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
                 "{{ '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
                 "{% if loop.last or loop.nextitem['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
                 ) if tools else ""
    return (system + fallback + head +
            "{% for message in messages %}"
            "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
            "{% generation %}{{ message['content'] or '' }}" + calls +
            "{{ '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
            + tool_turn +
            "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
            "{% endif %}"
            "{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


_LLAMA_TURN = ("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
               " + '<|eot_id|>' }}")
_LLAMA_REPLY = ("{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
                "{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}")
_LLAMA_PROMPT = "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"

_LLAMA31 = (
    "{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] | trim %}{% set messages = messages[1:] %}"
    "{% else %}{% set system = '' %}{% endif %}"
    "{{ '<|start_header_id|>system<|end_header_id|>\\n\\n' }}{% if tools %}{{ 'Environment: ipython\\n' }}{% endif %}"
    "{{ " + _q(_LLAMA31_DATE) + " + system + '<|eot_id|>' }}"
    "{% if tools %}{% if not messages %}{{ raise_exception('tools need a first user message to go in') }}{% endif %}"
    "{{ '<|start_header_id|>user<|end_header_id|>\\n\\n' + " + _q(_LLAMA31_TOOLS) + " }}"
    "{% for t in tools %}{{ t | tojson(indent=4) + '\\n\\n' }}{% endfor %}"
    "{{ messages[0]['content'] | trim + '<|eot_id|>' }}{% set messages = messages[1:] %}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] %}"
    "{% if message['tool_calls'] | length != 1 %}"
    "{{ raise_exception('Llama 3.1 takes one tool call per assistant message') }}{% endif %}"
    "{% set f = message['tool_calls'][0]['function'] %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% generation %}"
    "{{ '{\"name\": \"' + f['name'] + '\", \"parameters\": ' + f['arguments'] | tojson + '}<|eot_id|>' }}"
    "{% endgeneration %}"
    "{% elif message['role'] == 'assistant' %}" + _LLAMA_REPLY +
    # Llama 3.1's own template writes a tool result through tojson (a string too: it is iterable in Jinja)
    "{% elif message['role'] in ('tool', 'ipython') %}"
    "{{ '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message['content'] | tojson + '<|eot_id|>' }}"
    "{% else %}" + _LLAMA_TURN + "{% endif %}{% endfor %}" + _LLAMA_PROMPT
)

_MISTRAL_TOOLS = (
    "{{ '[AVAILABLE_TOOLS] [' }}{% for tool in tools %}{% set tool = tool['function'] %}"
    "{{ '{\"type\": \"function\", \"function\": {' }}"
    "{% for key, val in tool.items() if key != 'return' %}"
    "{% if val is string %}{{ '\"' + key + '\": \"' + val + '\"' }}{% else %}{{ '\"' + key + '\": ' + val | tojson }}"
    "{% endif %}{% if not loop.last %}{{ ', ' }}{% endif %}{% endfor %}{{ '}}' }}"
    "{% if not loop.last %}{{ ', ' }}{% else %}{{ ']' }}{% endif %}{% endfor %}{{ '[/AVAILABLE_TOOLS]' }}"
)
# Mistral-7B-Instruct-v0.3: "[INST] q[/INST] a</s>", tools before the last user message, [TOOL_CALLS] with 9-char
# ids, [TOOL_RESULTS]. Its own template writes the system prompt into the last user message only when that message
# ends the conversation (so a training conversation loses it); this one writes it into the last user message
# always: where the model sees it when it answers.
_MISTRAL = (
    "{% if messages and messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}"
    "{% set user_messages = messages | selectattr('role', 'equalto', 'user') | list %}"
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}"
    "{% if tools and message == user_messages[-1] %}" + _MISTRAL_TOOLS + "{% endif %}"
    "{{ '[INST] ' + (system + '\\n\\n' if system and message == user_messages[-1] else '') + message['content']"
    " + '[/INST]' }}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}{% generation %}{{ '[TOOL_CALLS] [' }}"
    "{% for call in message['tool_calls'] %}"
    "{% if call['id'] is not defined or call['id'] | length != 9 %}"
    "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}"
    "{{ (call['function'] | tojson)[:-1] + ', \"id\": \"' + call['id'] + '\"}' }}"
    "{% if not loop.last %}{{ ', ' }}{% else %}{{ ']' + eos_token }}{% endif %}{% endfor %}{% endgeneration %}"
    "{% elif message['role'] == 'assistant' %}"
    "{% generation %}{{ ' ' + message['content'] | trim + eos_token }}{% endgeneration %}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '[TOOL_RESULTS] {\"content\": ' + message['content'] | string + ', \"call_id\": \"' + message['tool_call_id']"
    " + '\"}[/TOOL_RESULTS]' }}"
    "{% endif %}{% endfor %}"
)

# Qwen3's thinking format (tested token for token against Qwen3-4B-Thinking-2507's released template): the history
# rule of its template kept (an assistant turn before the last user query loses its reasoning; after it, a turn
# writes <think>...</think> when it has reasoning, the last one always), the reasoning taken from a
# `reasoning_content` field or from <think> in the content; its tool preamble, <tool_call> blocks and
# <tool_response> turns; each assistant part (reasoning, reply, calls, end of turn) marked for training.
_QWEN3 = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- " + _q(_QWEN_TOOLS_HEAD[2:]) + " }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- " + _q(_QWEN_TOOLS_TAIL) + " }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' and message.content is string and not("
    "message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set reasoning_content = '' %}"
    "{%- if message.reasoning_content is string %}{%- set reasoning_content = message.reasoning_content %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}"
    "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}"
    "{{- '<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{%- else %}{{- content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}"
    "{%- set call = tool_call.function if tool_call.function else tool_call %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' }}"
    "{{- call.arguments if call.arguments is string else call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)
# Qwen3's non-thinking format (Qwen3-Instruct-2507, LLaMA-Factory's qwen3_nothink): its released template is
# Thinking-2507's but for the generation prompt, which opens no <think> block. The history rule is the same: the last
# assistant turn of a conversation is written with a <think> block, empty where it has no reasoning, as the model's
# own template writes it, so that block is trained too.
_QWEN3_THINK_PROMPT = "'<|im_start|>assistant\\n<think>\\n'"
_QWEN3_NOTHINK = _QWEN3.replace(_QWEN3_THINK_PROMPT, "'<|im_start|>assistant\\n'")

# Gemma 2 and 3: a system prompt (as written) and a blank line open the first user turn, whose own text is trimmed
# (Gemma 3's own template writes it so;
# Gemma 2's refuses a system role, and LLaMA-Factory folds it the same way); "model" is the reply's role.
_GEMMA = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = message['content'] + '\n\n' %}"
    "{% elif message['role'] == 'user' %}"
    "{{ '<start_of_turn>user\n' + ns.system + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% set ns.system = '' %}"
    "{% elif message['role'] == 'assistant' %}{{ '<start_of_turn>model\n' }}"
    "{% generation %}{{ message['content'] | trim + '<end_of_turn>' }}{% endgeneration %}{{ '\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


# DeepSeek-R1 and its distills (R1-Distill-Qwen/Llama): <｜User｜> / <｜Assistant｜> turns, the system prompt first,
# the answer ended by <｜end▁of▁sentence｜>. The model's own template drops the reasoning of every turn (it keeps what
# follows </think>); here the last turn keeps its reasoning and trains it, written after <｜Assistant｜> as the
# model's generation prompt opens it ("<think>\n"), and the earlier turns are written as the model's template writes
# them (LLaMA-Factory's deepseekr1 keeps the same parts). The reasoning comes from `reasoning_content` or from
# <think>...</think> in the content. No tool format (R1's writes the arguments as given strings): tool data is refused.
_DEEPSEEK_R1 = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for message in messages %}{% if message['role'] == 'system' %}{% set ns.system = message['content'] %}"
    "{% endif %}{% endfor %}{{ ns.system }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
    "{% elif message['role'] == 'assistant' %}"
    "{% set content = message['content'] %}{% set reasoning = '' %}"
    "{% if message.reasoning_content is string %}{% set reasoning = message.reasoning_content %}{% endif %}"
    "{% if '</think>' in content %}"
    "{% if not reasoning %}{% set reasoning = content.split('</think>')[0].split('<think>')[-1] %}{% endif %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<｜Assistant｜>' }}{% generation %}"
    "{% if loop.last and reasoning.strip() %}"
    "{{ '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}"
    "{% else %}{{ content }}{% endif %}"
    "{{ '<｜end▁of▁sentence｜>' }}{% endgeneration %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\n' }}{% endif %}"
)


# gpt-oss's harmony format (tested token for token against gpt-oss-120b's released template): the system message
# with the model identity, knowledge cutoff, today's date and the reasoning effort (`model_identity`,
# `reasoning_effort` as the model's template takes them); a first system or developer message and the tools (a
# TypeScript namespace) in the developer message; a reply in the `final` channel, ended by <|return|> as the last
# turn and <|end|> in the history; the reasoning (`thinking`) in the `analysis` channel, written for the last turn
# and for a call with no later answer, as harmony keeps it; a call as its own message to=functions.NAME, its result
# from functions.NAME. What is trained: everything after <|start|>assistant of each turn. Where the model's template
# would write a turn differently or drop part of it silently (a second call in one message, a later system message,
# a parameter schema with oneOf or nested properties), this one refuses the record instead.
_GPT_OSS_TYPE = (
    "{%- macro ts(p) -%}"
    "{%- if p.oneOf or (p.type == 'object' and p.properties) -%}"
    "{{- raise_exception('gpt_oss: a tool parameter with oneOf or nested properties; use the model\\'s own template "
    "(data.template: auto)') }}"
    "{%- elif p.type == 'array' -%}"
    "{%- if 'items' in p -%}"
    "{%- set t = {'string': 'string', 'number': 'number', 'integer': 'number', 'boolean': 'boolean'}"
    ".get(p['items']['type']) -%}"
    "{%- if t -%}{{- t + '[]' }}{%- else -%}{%- set inner = ts(p['items']) -%}"
    "{{- 'any[]' if inner == 'object | object' or inner | length > 50 else inner + '[]' }}{%- endif -%}"
    "{%- else -%}{{- 'any[]' }}{%- endif -%}{{- ' | null' if p.nullable else '' }}"
    "{%- elif p.type is defined and p.type is iterable and p.type is not string and p.type is not mapping "
    "and p.type[0] is defined -%}{{- p.type | join(' | ') }}"
    "{%- elif p.type == 'string' -%}"
    "{{- ('\"' + p.enum | join('\" | \"') + '\"') if p.enum else 'string' + (' | null' if p.nullable else '') }}"
    "{%- elif p.type in ('number', 'integer') -%}{{- 'number' }}"
    "{%- elif p.type == 'boolean' -%}{{- 'boolean' }}"
    "{%- elif p.type == 'object' -%}{{- 'object' }}"
    "{%- else -%}{{- 'any' }}{%- endif -%}"
    "{%- endmacro -%}"
)
_GPT_OSS = _GPT_OSS_TYPE + (
    "{{- '<|start|>system<|message|>' + (model_identity if model_identity is defined else "
    "'You are ChatGPT, a large language model trained by OpenAI.') + '\\nKnowledge cutoff: 2024-06\\nCurrent date: '"
    " + strftime_now('%Y-%m-%d') + '\\n\\nReasoning: ' + (reasoning_effort if reasoning_effort is defined else "
    "'medium') + '\\n\\n# Valid channels: analysis, commentary, final. Channel must be included for every message.' }}"
    "{%- if tools %}{{- '\\nCalls to these tools must go to the commentary channel: \\'functions\\'.' }}{%- endif %}"
    "{{- '<|end|>' }}"
    "{%- set first = messages[0] if messages else {} %}"
    "{%- set chat = messages[1:] if first.role in ('system', 'developer') else messages %}"
    "{%- set instructions = first.content if first.role in ('system', 'developer') else '' %}"
    "{%- if instructions or tools %}{{- '<|start|>developer<|message|>' }}"
    "{%- if instructions %}{{- '# Instructions\\n\\n' + instructions + '\\n\\n' }}{%- endif %}"
    "{%- if tools %}{{- '# Tools\\n\\n## functions\\n\\nnamespace functions {\\n\\n' }}"
    "{%- for tool in tools %}{%- set f = tool.function %}"
    "{{- '// ' + f.description + '\\ntype ' + f.name + ' = ' }}"
    "{%- if f.parameters and f.parameters.properties %}{{- '(_: {\\n' }}"
    "{%- for name, p in f.parameters.properties.items() %}"
    "{%- if p.description %}{{- '// ' + p.description + '\\n' }}{%- endif %}"
    "{{- name + ('' if name in (f.parameters.required or []) else '?') + ': ' + ts(p) }}"
    "{%- if p.default is defined %}{{- ', // default: ' + (p.default if p.enum else p.default | tojson) }}"
    "{%- endif %}{{- ',\\n' }}{%- endfor %}{{- '}) => any;\\n\\n' }}"
    "{%- else %}{{- '() => any;\\n\\n' }}{%- endif %}{%- endfor %}{{- '} // namespace functions' }}{%- endif %}"
    "{{- '<|end|>' }}{%- endif %}"
    "{%- set ns = namespace(call=none) %}"
    "{%- for message in chat %}"
    "{%- if message.role == 'assistant' and 'tool_calls' in message %}"
    "{%- if message.tool_calls | length != 1 %}"
    "{{- raise_exception('gpt_oss: harmony writes one tool call per assistant message; give each call its own "
    "message') }}{%- endif %}"
    "{%- if message.content and message.thinking %}"
    "{{- raise_exception('gpt_oss: a call with both a reply and reasoning; harmony writes one analysis message "
    "before a call: keep one of them') }}{%- endif %}"
    "{%- set later = namespace(answer=false) %}"
    "{%- for f in chat[loop.index:] %}{%- if f.role == 'assistant' and 'tool_calls' not in f %}"
    "{%- set later.answer = true %}{%- endif %}{%- endfor %}"
    "{%- set call = message.tool_calls[0].function if message.tool_calls[0].function else message.tool_calls[0] %}"
    "{%- set thought = '' if later.answer else (message.content or message.thinking or '') %}"
    "{{- '<|start|>assistant' }}{%- generation %}"
    "{%- if thought %}{{- '<|channel|>analysis<|message|>' + thought + '<|end|><|start|>assistant' }}{%- endif %}"
    "{{- ' to=functions.' + call.name + '<|channel|>commentary json<|message|>' + call.arguments | tojson"
    " + '<|call|>' }}{%- endgeneration %}{%- set ns.call = call.name %}"
    "{%- elif message.role == 'assistant' %}{{- '<|start|>assistant' }}{%- generation %}"
    "{%- if loop.last and not add_generation_prompt %}"
    "{%- if 'thinking' in message %}"
    "{{- '<|channel|>analysis<|message|>' + message.thinking + '<|end|><|start|>assistant' }}"
    "{%- endif %}{{- '<|channel|>final<|message|>' + message.content + '<|return|>' }}"
    "{%- else %}{{- '<|channel|>final<|message|>' + message.content + '<|end|>' }}{%- endif %}{%- endgeneration %}"
    "{%- set ns.call = none %}"
    "{%- elif message.role == 'tool' %}"
    "{%- if ns.call is none %}{{- raise_exception('gpt_oss: a tool result without an assistant call before it') }}"
    "{%- endif %}"
    "{{- '<|start|>functions.' + ns.call + ' to=assistant<|channel|>commentary<|message|>' + message.content | tojson"
    " + '<|end|>' }}"
    "{%- elif message.role == 'user' %}{{- '<|start|>user<|message|>' + message.content + '<|end|>' }}"
    "{%- else %}{{- raise_exception('gpt_oss: a ' + message.role + ' message after the first; harmony has one system "
    "message') }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)


BUILTIN_TEMPLATES: dict[str, str] = {
    "alpaca": (
        "{% for message in messages %}"
        "{% if message['role'] == 'system' %}{{ message['content'] + '\n\n' }}"
        "{% elif message['role'] == 'user' %}"
        "{% if message.get('input') %}{{ '### Instruction:\n' + message['instruction'] + '\n\n### Input:\n'"
        " + message['input'] + '\n\n### Response:\n' }}"
        "{% else %}{{ '### Instruction:\n' + message['content'] + '\n\n### Response:\n' }}{% endif %}"
        "{% elif message['role'] == 'assistant' %}" + _GEN + "{% if not loop.last %}{{ '\n\n' }}{% endif %}"
        "{% endif %}{% endfor %}"
    ),
    "chatml": (
        "{% for message in messages %}"
        "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
        "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
        "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    "qwen": _chatml(QWEN_SYSTEM, tools=True),
    "qwen2": _chatml(QWEN2_SYSTEM, tools=False),
    "qwen3": _QWEN3,
    "qwen3_nothink": _QWEN3_NOTHINK,
    "llama3": (
        "{{ bos_token }}{% for message in messages %}"
        "{% if message['role'] == 'assistant' %}" + _LLAMA_REPLY + "{% else %}" + _LLAMA_TURN + "{% endif %}"
        "{% endfor %}" + _LLAMA_PROMPT
    ),
    "llama3.1": _LLAMA31,
    "mistral": _MISTRAL,
    # Mistral-7B-Instruct-v0.1's spacing: "[INST] q [/INST]a</s>"; a system prompt before the first user message.
    "mistral_v1": (
        "{{ bos_token }}{% set ns = namespace(system='') %}"
        "{% for message in messages %}"
        "{% if message['role'] == 'system' %}{% set ns.system = message['content'] + '\n\n' %}"
        "{% elif message['role'] == 'user' %}{{ '[INST] ' + ns.system + message['content'] + ' [/INST]' }}"
        "{% set ns.system = '' %}"
        "{% elif message['role'] == 'assistant' %}" + _GEN + "{% endif %}"
        "{% endfor %}"
    ),
    "deepseek_r1": _DEEPSEEK_R1,
    "gemma": _GEMMA,
    "gemma3": _GEMMA,
    "gpt_oss": _GPT_OSS,
    "vicuna": (
        "{% for message in messages %}"
        "{% if message['role'] == 'system' %}{{ message['content'] + ' ' }}"
        "{% elif message['role'] == 'user' %}{{ 'USER: ' + message['content'] + ' ASSISTANT:' }}"
        "{% elif message['role'] == 'assistant' %}{{ ' ' }}" + _GEN + "{% endif %}"
        "{% endfor %}"
    ),
}
# Built-ins that render tool declarations, calls and results in their model's own format.
TOOL_TEMPLATES = ("qwen", "qwen3", "qwen3_nothink", "llama3.1", "mistral", "gpt_oss")
