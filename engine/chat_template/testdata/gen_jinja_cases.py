#!/usr/bin/env python3
"""Regenerates jinja_cases.json: expected renders from Python's jinja2, configured the way
transformers' apply_chat_template configures it. Run by hand (needs jinja2); CI only reads the
committed JSON.

    python3 engine/chat_template/testdata/gen_jinja_cases.py > engine/chat_template/testdata/jinja_cases.json
"""
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class RaisedError(Exception):
    pass


def make_env():
    def raise_exception(message):
        raise RaisedError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


MSGS = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "What's 2+2?"},
]

CASES = [
    # Text and whitespace control.
    ("plain", "hello world", {}),
    ("trailing_newline_dropped", "hello\n", {}),
    ("only_one_trailing_newline_dropped", "hello\n\n", {}),
    ("crlf", "a\r\nb\rc", {}),
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter", {}),
    ("lstrip_blocks", "  {% if true %}\n  yes\n  {% endif %}\nafter", {}),
    ("lstrip_not_for_vars", "  {{ 'x' }}\n", {}),
    ("lstrip_mid_line", "a  {% if true %}b{% endif %}", {}),
    ("dash_left", "a   \n  {%- if true %}b{% endif %}", {}),
    ("dash_right", "{% if true -%}   \n  b{% endif %}", {}),
    ("var_dash", "a  {{- 'x' -}}  b", {}),
    ("plus_disables_lstrip", "  {%+ if true %}x{% endif %}", {}),
    ("plus_disables_trim", "{% if true +%}\nx{% endif %}", {}),
    ("comment", "a{# comment #}b\n  {# c2 #}\nc", {}),
    ("comment_dash", "a  {#- c -#}  b", {}),
    ("raw", "{% raw %}{{ not parsed }}{% endraw %}", {}),
    ("raw_newline", "{% raw %}\n{{ x }}\n{% endraw %}\nz", {}),
    ("for_trim", "{% for x in [1,2,3] %}\n{{ x }}\n{% endfor %}\n", {}),
    ("nested_indent", "{% for m in messages %}\n    {% if m.role == 'user' %}\n        U:{{ m.content }}\n    {% endif %}\n{% endfor %}", {"messages": MSGS}),
    # Literals and printing.
    ("print_types", "{{ 1 }}|{{ 1.5 }}|{{ 1.0 }}|{{ true }}|{{ none }}|{{ 'a' }}|{{ [1, 'b', none, true] }}|{{ {'a': 1, 'b': [2]} }}|{{ (1, 2) }}|{{ (1,) }}", {}),
    ("print_floats", "{{ 1e20 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 0.1 + 0.2 }} {{ 2.5e-7 }} {{ 123456.789 }}", {}),
    ("repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'tab\\there', 'nl\\n'] }}", {}),
    ("string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\\u00e9\\x41\\d' }}", {}),
    ("adjacent_strings", "{{ 'a' 'b' \"c\" }}", {}),
    ("unicode", "{{ 'héllo wörld ✓' }}|{{ 'héllo'|length }}|{{ 'héllo'[1] }}|{{ 'héllo'[1:3] }}", {}),
    ("underscore_numbers", "{{ 1_000 + 2 }}", {}),
    ("json_context_types", "{{ i }} {{ f }} {{ b }} {{ n }} {{ s }} {{ l }} {{ d }}", {"i": 3, "f": 2.0, "b": False, "n": None, "s": "x", "l": [1, 2.5], "d": {"k": "v"}}),
    # Arithmetic.
    ("arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}", {}),
    ("arith_mixed", "{{ 1 + 1.5 }} {{ true + 1 }} {{ 3 - 5 }} {{ -(3) }} {{ +3 }} {{ - 2 ** 2 }}", {}),
    ("string_ops", "{{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ 2 * 'x' }} {{ [1] * 3 }} {{ [1] + [2] }} {{ 1 ~ 'a' ~ none ~ true }}", {}),
    ("percent_format", "{{ '%s is %d years' % ('Bob', 42) }} {{ '%05.2f' % 3.14159 }} {{ '%s' % 'x' }} {{ '100%%' % () }}", {}),
    ("div_zero", "{{ 1 / 0 }}", {}),
    ("add_type_error", "{{ 'a' + 1 }}", {}),
    # Comparisons and logic.
    ("compare", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 1 != 2 }} {{ [1, 2] == [1, 2] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ none == none }} {{ (1, 2) == [1, 2] }}", {}),
    ("logic", "{{ true and 'x' }} {{ false or 'y' }} {{ not none }} {{ 0 or [] or 'z' }} {{ 1 and 0 }} {{ not 1 == 2 }}", {}),
    ("in_ops", "{{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 3 not in [3] }} {{ 'x' in undefined_thing }}", {}),
    ("compare_type_error", "{{ 1 < 'a' }}", {}),
    ("cond_expr", "{{ 'yes' if 1 else 'no' }} {{ 'yes' if 0 else 'no' }} [{{ 'only' if false }}] {{ 'a' if false else 'b' if true else 'c' }}", {}),
    # Variables, attributes, items.
    ("attr_item", "{{ m.role }} {{ m['content'] }} {{ m.missing }}|{{ m['missing'] }}|{{ l[0] }} {{ l[-1] }} {{ l[5] }}|{{ l.0 }}", {"m": {"role": "user", "content": "hi"}, "l": [1, 2, 3]}),
    ("undefined_prints_empty", "[{{ nothing }}]", {}),
    ("undefined_attr_error", "{{ nothing.attr }}", {}),
    ("undefined_item_error", "{{ nothing['x'] }}", {}),
    ("none_attr_undefined", "[{{ n.x }}] {{ n.x is defined }}", {"n": None}),
    ("dict_method_vs_key", "{{ d.items() | list }} {{ d.get('a') }} {{ d.get('zz', 'dflt') }} {{ d.get('zz') }} {{ d.keys() | list }} {{ d.values() | list }}", {"d": {"a": 1, "b": 2}}),
    ("slices", "{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ l[1:3] }} {{ l[-2:] }} {{ l[5:] }} {{ s[::-1] }} {{ s[1:-1] }}", {"l": [1, 2, 3, 4], "s": "hello"}),
    ("messages_slice", "{% for m in messages[1:] %}{{ m.role }},{% endfor %}", {"messages": MSGS}),
    # Tests.
    ("tests", "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ n is none }} {{ x is not none }} {{ x is string }} {{ x is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is boolean }} {{ true is number }} {{ d is mapping }} {{ l is mapping }} {{ l is iterable }} {{ x is iterable }} {{ d is sequence }} {{ 3 is iterable }} {{ true is true }} {{ 1 is true }} {{ false is false }}", {"x": "s", "n": None, "d": {}, "l": []}),
    ("tests_args", "{{ 4 is divisibleby 2 }} {{ 5 is divisibleby(2) }} {{ 3 is odd }} {{ 3 is even }} {{ 'a' is equalto 'a' }} {{ 1 is eq 2 }} {{ 2 is in [1, 2] }} {{ none is sameas none }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 2 is gt 1 }} {{ 2 is lt 1 }} {{ 1 is ne 1 }}", {}),
    ("test_in_not", "{{ not x is defined }} {{ x is not defined and true }}", {}),
    # Filters.
    ("filter_strings", "{{ '  hi  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'Hi'|upper }}|{{ 'Hi'|lower }}|{{ 'hello world'|title }}|{{ 'hELLO wORLD'|capitalize }}|{{ 'a-b c(d'|title }}|{{ 'aaa'|replace('a', 'b') }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 'abc'|reverse }}", {}),
    ("filter_length", "{{ [1,2]|length }} {{ 'abc'|length }} {{ {'a':1}|length }} {{ [1,2,3]|count }} {{ u|length }}", {}),
    ("filter_first_last", "{{ [1,2,3]|first }} {{ [1,2,3]|last }} {{ 'abc'|first }} {{ 'abc'|last }} [{{ []|first }}] {{ {'k': 1, 'j': 2}|first }}", {}),
    ("filter_default", "{{ u|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ none|default('d') }} {{ none|d('d', true) }} {{ 0|default(5) }}", {}),
    ("filter_join", "{{ [1, 2, 3]|join(', ') }} {{ ['a','b']|join }} {{ users|join(', ', attribute='name') }}", {"users": [{"name": "a"}, {"name": "b"}]}),
    ("filter_list_items", "{{ 'ab'|list }} {{ {'a':1}|list }} {{ {'a': 1, 'b': 2}|items|list }} {% for k, v in {'x': 1, 'y': 2}|items %}{{ k }}={{ v }};{% endfor %}", {}),
    ("filter_tojson", "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ 'é\"\\n\\u0001'|tojson }}|{{ [1.0, 2.5, none, true]|tojson }}|{{ {}|tojson }}|{{ []|tojson(indent=4) }}|{{ d|tojson(separators=(',', ':')) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ 'é'|tojson(ensure_ascii=true) }}|{{ '😀'|tojson(ensure_ascii=true) }}", {"d": {"name": "f", "args": {"x": [1, 2], "y": {"z": None}}}}),
    ("filter_tojson_tools", "{% for t in tools %}{{ t|tojson(indent=4) }}\n{% endfor %}", {"tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]}),
    ("filter_tojson_undefined_error", "{{ nothing|tojson }}", {}),
    ("filter_map_select", "{{ users|map(attribute='name')|list }} {{ users|selectattr('admin')|map(attribute='name')|join(',') }} {{ users|rejectattr('admin')|list|length }} {{ users|selectattr('name', 'equalto', 'b')|list }} {{ [1,2,3,4]|select('odd')|list }} {{ [1,2,3,4]|reject('odd')|list }} {{ ['a','b']|map('upper')|list }} {{ [0, 1, '', 'x']|select|list }}", {"users": [{"name": "a", "admin": True}, {"name": "b", "admin": False}]}),
    ("filter_sort_unique", "{{ [3,1,2]|sort }} {{ [3,1,2]|sort(reverse=true) }} {{ ['b','A','c']|sort }} {{ ['b','A','c']|sort(case_sensitive=true) }} {{ users|sort(attribute='age')|map(attribute='name')|join }} {{ [1,2,1,3]|unique|list }} {{ ['a','A','b']|unique|list }}", {"users": [{"name": "x", "age": 3}, {"name": "y", "age": 1}]}),
    ("filter_minmax_sum", "{{ [3,1,2]|max }} {{ [3,1,2]|min }} {{ [1,2,3]|sum }} {{ users|sum(attribute='age') }} {{ ['b','A']|max }} {{ -3|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.1|round(0, 'ceil') }}", {"users": [{"name": "x", "age": 3}, {"name": "y", "age": 1}]}),
    ("filter_int_float_string", "{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '1.5'|float }} {{ 2|float }} {{ 42|string ~ 'x' }} {{ none|string }} {{ true|int }}", {}),
    ("filter_misc", "{{ '<a href=\"x\">&\\''|e }} {{ 'x'|safe }} {{ 'one two  three'|wordcount }} {{ {'b': 1, 'a': 2}|dictsort }} {{ '%s-%s'|format('a', 'b') }} {{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ x|attr('upper') is defined }}", {"x": "s"}),
    ("filter_chain_precedence", "{{ -1|abs }} {{ 'a' ~ 'b'|upper }} {{ [1,2]|length + 1 }} {{ not [] |length }}", {}),
    ("filter_on_undefined", "[{{ u|upper }}][{{ u|trim }}][{{ u|join(',') }}][{{ u|list }}][{{ u|string }}][{{ u|first }}]", {}),
    # String methods.
    ("str_methods", "{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'Hi'.upper() }}|{{ 'Hi'.lower() }}|{{ 'aXa'.replace('a', 'b') }}|{{ 'hello wORLD'.title() }}|{{ 'hELLO'.capitalize() }}", {}),
    ("str_methods2", "{{ 'abcabc'.find('c') }} {{ 'abc'.find('z') }} {{ 'abcabc'.rfind('b') }} {{ 'aaa'.count('a') }} {{ '-'.join(['a', 'b']) }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ ' '.isspace() }} {{ 'a{}b{}'.format(1, 'x') }} {{ '{0}-{0}'.format(7) }} {{ '{name}!'.format(name='n') }} {{ 'l1\\nl2\\r\\nl3'.splitlines() }} {{ 'prefix_x'.removeprefix('prefix_') }}", {}),
    ("str_method_on_content", "{% for m in messages %}{{ m.content.strip().upper() }}|{% endfor %}", {"messages": [{"role": "user", "content": "  hi  "}]}),
    ("list_mutation_refused", "{% set l = [1] %}{{ l.append(2) }}", {}),
    ("dict_mutation_refused", "{% set d = {} %}{{ d.update({'a': 1}) }}", {}),
    # Statements.
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}other{% endif %},{% endfor %}", {}),
    ("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}", {}),
    ("for_prev_next_cycle", "{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.cycle('a', 'b') }};{% endfor %}", {}),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}{% for x in [1] %}{{ x }}{% else %}empty{% endfor %}", {}),
    ("for_filter", "{% for m in messages if m.role != 'system' %}{{ loop.index }}:{{ m.role }}/{{ loop.length }} {% endfor %}", {"messages": MSGS}),
    ("for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}{% for (a, b) in [(5, 6)] %}{{ a * b }}{% endfor %}", {"d": {"x": 1, "y": 2}}),
    ("for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"x": 1, "y": 2}}),
    ("for_undefined", "[{% for x in nothing %}{{ x }}{% endfor %}]", {}),
    ("for_none_error", "{% for x in n %}{{ x }}{% endfor %}", {"n": None}),
    ("for_scope", "{% set x = 5 %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}", {}),
    ("for_nested_loop", "{% for a in [1, 2] %}{% set outer = loop %}{% for b in [3, 4] %}{{ outer.index }}{{ loop.index }} {% endfor %}{% endfor %}", {}),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("set_and_namespace", "{% set ns = namespace(found=false, count=0) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.found = true %}{% set ns.count = ns.count + 1 %}{% endif %}{% endfor %}{{ ns.found }} {{ ns.count }}", {"messages": MSGS}),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 3, 4 %}{{ t }}", {}),
    ("set_block", "{% set x %}hello {{ 'world' }}{% endset %}[{{ x }}]", {}),
    ("set_overrides_context", "{% set messages = messages[1:] %}{{ messages|length }}", {"messages": MSGS}),
    ("set_in_if_is_global", "{% if true %}{% set y = 3 %}{% endif %}{{ y }}", {}),
    ("namespace_repr", "{{ namespace(a=1) }}", {}),
    ("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}", {}),
    ("set_attr_non_namespace", "{% set d = {} %}{% set d.x = 1 %}", {}),
    ("macro", "{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(name='c', punct='.') }}", {}),
    ("macro_recursive", "{% macro render(v) %}{% if v is mapping %}{{ '{' }}{% for k, x in v.items() %}{{ k }}:{{ render(x) }},{% endfor %}{{ '}' }}{% elif v is iterable and v is not string %}[{% for x in v %}{{ render(x) }} {% endfor %}]{% else %}{{ v }}{% endif %}{% endmacro %}{{ render(d) }}", {"d": {"a": [1, {"b": 2}], "c": "s"}}),
    ("macro_sees_globals", "{% set g = 'G' %}{% macro f() %}{{ g }}{{ messages|length }}{% endmacro %}{{ f() }}", {"messages": MSGS}),
    ("macro_too_many_args", "{% macro f(a) %}{{ a }}{% endmacro %}{{ f(1, 2) }}", {}),
    ("macro_missing_arg", "{% macro f(a, b) %}[{{ a }}][{{ b }}]{% endmacro %}{{ f(1) }}", {}),
    ("with", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", {}),
    ("range", "{{ range(3)|list }} {{ range(1, 4)|list }} {{ range(10, 0, -3)|list }} {% for i in range(2) %}{{ i }}{% endfor %}", {}),
    ("range_too_big", "{{ range(200000)|length }}", {}),
    ("dict_global", "{{ dict(a=1, b='x') }}", {}),
    ("raise_exception", "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}", {"messages": MSGS}),
    ("raise_exception_concat", "{{ raise_exception('bad role: ' ~ messages[0].role) }}", {"messages": MSGS}),
    ("bos_eos", "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}", {"bos_token": "<s>", "eos_token": "</s>", "messages": MSGS}),
    ("tools_none", "{% if tools is not none %}has tools{% else %}no tools{% endif %}", {"tools": None}),
    ("tools_undefined", "{% if tools is defined %}defined{% else %}undefined{% endif %}", {}),
    ("string_iteration_vs_membership", "{% if m.content is string %}S{% else %}{% for c in m.content %}{{ c.type }}{% endfor %}{% endif %}", {"m": {"content": [{"type": "text"}, {"type": "image"}]}}),
    ("content_parts", "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% elif p.type == 'image' %}<image>{% endif %}{% endfor %}{% endif %}{% endfor %}", {"messages": [{"role": "user", "content": [{"type": "text", "text": "look: "}, {"type": "image"}]}, {"role": "user", "content": "plain"}]}),
    ("mistral_like", "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}", {"bos_token": "<s>", "eos_token": "</s>", "messages": MSGS[1:]}),
    ("llama3_like", "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}", {"bos_token": "<|begin_of_text|>", "messages": MSGS, "add_generation_prompt": True}),
    ("qwen_like", "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- messages[0]['content'] }}\n    {%- endif %}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n{%- endif %}\n{%- for message in messages %}\n    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n", {"messages": MSGS, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "add_generation_prompt": True}),
    ("reverse_loop_ns", "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n{%- for message in messages[::-1] %}\n    {%- set index = (messages|length - 1) - loop.index0 %}\n    {%- if ns.multi_step_tool and message.role == \"user\" %}\n        {%- set ns.multi_step_tool = false %}\n        {%- set ns.last_query_index = index %}\n    {%- endif %}\n{%- endfor %}\n{{ ns.last_query_index }}", {"messages": MSGS}),
    ("think_split", "{%- set content = m.content %}{%- if '</think>' in content %}{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}[{{ reasoning_content }}][{{ content }}]", {"m": {"content": "<think>\nhmm\n</think>\n\nanswer"}}),
    ("filter_block", "{% set x %}{% filter trim %}\n  padded  \n{% endfilter %}{% endset %}[{{ x }}]{% filter upper | replace('A', '4') %}abc{% endfilter %}", {}),
    ("markup_plus_escapes", "{{ 'a<'|safe + '<b>' }}|{{ '<i>' + 'x'|safe }}|{{ ('%s'|safe) % '<' }}|{{ 'a<'|safe ~ '<' }}|{{ '<'|e }}|{{ '<'|e|e }}|{{ ('x'|safe).upper() + '&' }}", {}),
    ("generators", "{{ [1, 2]|select('odd')|list }} {{ ([]|select) is true }} {% if []|select %}truthy{% endif %} {{ [3, 1]|reverse|list }} {{ {'a': 1}.items()|list }} {{ ({'a': 1}|items|list)[0] }} {{ none|select|list }} {{ none|map('upper')|list }}", {}),
    ("generator_tojson_error", "{{ tools|map(attribute='function')|tojson }}", {"tools": [{"function": {"name": "f"}}]}),
    ("generator_length_error", "{{ [1, 2]|select('odd')|length }}", {}),
    ("dict_view_repr", "{{ d.items() }} {{ d.keys() }} {{ d.values() }} {{ d.items()|length }}", {"d": {"a": 1}}),
    ("dict_view_tojson_error", "{{ d.keys()|tojson }}", {"d": {"a": 1}}),
    ("strftime_literal", "{{ strftime_now('%%') }}", {}),
]


def render(src, ctx):
    try:
        return {"expected": make_env().from_string(src).render(**ctx)}
    except RaisedError as e:
        return {"raised": str(e)}
    except Exception as e:  # Any other error: the interpreter must fail too.
        return {"error": "%s: %s" % (type(e).__name__, e)}


def main():
    out = []
    for name, src, ctx in CASES:
        case = {"name": name, "template": src, "context": ctx}
        case.update(render(src, ctx))
        out.append(case)
    json.dump({"jinja2_version": jinja2.__version__, "cases": out}, sys.stdout, indent=1,
              ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
