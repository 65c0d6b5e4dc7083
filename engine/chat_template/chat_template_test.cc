#include "engine/chat_template/chat_template.h"

#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/civil_time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine {
namespace {

using json = nlohmann::ordered_json;

json LoadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return json::parse(in);
}

absl::StatusOr<std::string> RenderText(absl::string_view src, const json& ctx = json::object()) {
  auto t = ChatTemplate::Create(src);
  if (!t.ok()) return t.status();
  return (*t)->Render(ctx);
}

// Every case in testdata/jinja_cases.json was rendered by Python's jinja2, configured as
// transformers configures it (see gen_jinja_cases.py).
TEST(ChatTemplateTest, MatchesJinja2) {
  const json data = LoadJson("engine/chat_template/testdata/jinja_cases.json");
  ASSERT_GT(data["cases"].size(), 50u);
  for (const json& c : data["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    auto t = ChatTemplate::Create(c["template"].get<std::string>());
    ASSERT_TRUE(t.ok()) << t.status();
    auto out = (*t)->Render(c["context"]);
    if (c.contains("expected")) {
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(*out, c["expected"].get<std::string>());
    } else if (c.contains("raised")) {
      ASSERT_FALSE(out.ok());
      EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(out.status().message(), c["raised"].get<std::string>());
    } else {
      EXPECT_FALSE(out.ok()) << "expected an error like: " << c["error"] << "\ngot: " << *out;
    }
  }
}

// The context transformers' apply_chat_template gives a template: the tokenizer's special
// tokens that are set, the conversation, tools, documents, add_generation_prompt, then kwargs.
json HfContext(const json& config, const json& c) {
  json ctx = json::object();
  for (auto it = config.begin(); it != config.end(); ++it) {
    const std::string& key = it.key();
    if (key.size() < 6 || key.compare(key.size() - 6, 6, "_token") != 0) continue;
    if (it.value().is_string()) ctx[key] = it.value();
    if (it.value().is_object() && it.value().contains("content")) {
      ctx[key] = it.value()["content"];
    }
  }
  ctx["messages"] = c["messages"];
  ctx["tools"] = c["tools"];
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = c["add_generation_prompt"];
  for (auto it = c["extra"].begin(); it != c["extra"].end(); ++it) ctx[it.key()] = it.value();
  return ctx;
}

// Fixtures rendered by transformers itself (engine/testdata/templates, branch `fixtures`).
TEST(ChatTemplateTest, MatchesTransformersFixtures) {
  int checked = 0;
  for (const char* family : {"llama3", "qwen2", "mistral", "qwen3"}) {
    SCOPED_TRACE(family);
    const std::string dir = std::string("engine/testdata/templates/") + family;
    const json config = LoadJson(dir + "/tokenizer_config.json");
    const json cases = LoadJson(dir + "/cases.json");
    for (const bool has_tools : {false, true}) {
      auto t = LoadChatTemplate(config, has_tools);
      ASSERT_TRUE(t.ok()) << t.status();
      for (size_t i = 0; i < cases["cases"].size(); ++i) {
        const json& c = cases["cases"][i];
        if (c["tools"].is_null() == has_tools) continue;
        SCOPED_TRACE(i);
        auto out = (*t)->Render(HfContext(config, c));
        if (c.contains("error")) {
          ASSERT_FALSE(out.ok()) << *out;
          EXPECT_TRUE(absl::StrContains(out.status().message(), c["error"].get<std::string>()))
              << out.status();
        } else {
          ASSERT_TRUE(out.ok()) << out.status();
          EXPECT_EQ(*out, c["rendered"].get<std::string>());
        }
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 40);
}

TEST(ChatTemplateTest, RejectsUnsupportedConstructsAtLoad) {
  struct Case {
    const char* src;
    const char* message;
  };
  const Case cases[] = {
      {"a\nb\n{{ x|wordwrap }}", "chat template line 3: filter \"wordwrap\" is not supported"},
      {"{% if x is foo %}{% endif %}", "chat template line 1: test \"foo\" is not supported"},
      {"{% include 'x' %}", "chat template line 1: tag \"include\" is not supported"},
      {"{% call f() %}{% endcall %}", "tag \"call\" is not supported"},
      {"{{ x.frobnicate() }}", "method \"frobnicate\" is not supported"},
      {"{{ lipsum() }}", "function \"lipsum\" is not supported"},
      {"{% for x in y recursive %}{% endfor %}", "recursive for loops are not supported"},
      {"{% break %}", "'break' outside of a loop"},
      {"{% if x %}", "unexpected end of template"},
      {"{{ x ", "is not closed"},
      {"{{ 'abc }}", "string literal is not closed"},
      {"{# x", "comment is not closed"},
      {"{% endif %}", "without a matching opening tag"},
      {"{{ (1 }}", "unexpected '}'"},
      {"{{ f(*args) }}", "*args"},
  };
  for (const Case& c : cases) {
    auto t = ChatTemplate::Create(c.src);
    ASSERT_FALSE(t.ok()) << c.src;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(t.status().message(), c.message))
        << c.src << " -> " << t.status().message();
  }
}

TEST(ChatTemplateTest, RuntimeErrorsNameTheLine) {
  auto out = RenderText("line1\n{{ 1 }}\n{{ 'a' + 1 }}");
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::StartsWith(out.status().message(), "chat template line 3: "))
      << out.status();
  EXPECT_TRUE(absl::StrContains(out.status().message(), "'str' and 'int'")) << out.status();
}

// A namespace that holds itself (lists and dicts cannot be mutated: the sandbox refuses append and
// update) prints with "{...}" where it recurs, instead of recursing until the stack runs out
// (found by the fuzzer: a segfault, which in a server takes every request down with it).
// Comparing, serialising or measuring one gives an answer or an error, not a crash.
TEST(ChatTemplateTest, ANamespaceHoldingItselfDoesNotCrash) {
  auto direct = RenderText("{% set n = namespace(a=1) %}{% set n.b = n %}{{ n }}");
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(*direct, "<Namespace {'a': 1, 'b': <Namespace {...}>}>");
  auto in_list = RenderText("{% set n = namespace(a=1) %}{% set n.b = [n, 2] %}{{ n.b }}");
  ASSERT_TRUE(in_list.ok()) << in_list.status();
  EXPECT_EQ(*in_list, "[<Namespace {'a': 1, 'b': [...]}>, 2]");
  for (const char* src : {"{% set n = namespace() %}{% set n.b = [n] %}{{ n.b == [n] }}",
                          "{% set n = namespace() %}{% set n.b = [n] %}{{ n.b | tojson }}",
                          "{% set n = namespace() %}{% set n.b = [n] %}{{ n.b | string | length }}",
                          "{% set n = namespace() %}{% set n.b = n %}{{ n.b.b.b.b }}"}) {
    SCOPED_TRACE(src);
    auto out = RenderText(src);
    if (out.ok()) EXPECT_FALSE(out->empty());
  }
}

TEST(ChatTemplateTest, GenerationTagRendersItsBody) {
  auto out = RenderText("{% generation %}gen{{ 1 }}{% endgeneration %}!");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "gen1!");
}

TEST(ChatTemplateTest, StrftimeNowUsesInjectedClock) {
  ChatTemplate::Options options;
  options.clock = [] {
    return absl::FromCivil(absl::CivilSecond(2024, 7, 26, 10, 0, 0), absl::LocalTimeZone());
  };
  auto t = ChatTemplate::Create("Today Date: {{ strftime_now('%d %b %Y') }}", options);
  ASSERT_TRUE(t.ok()) << t.status();
  auto out = (*t)->Render(json::object());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "Today Date: 26 Jul 2024");
}

TEST(ChatTemplateTest, ContextMustBeAnObject) {
  auto t = ChatTemplate::Create("x");
  ASSERT_TRUE(t.ok());
  auto out = (*t)->Render(json::array());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, StepBudgetStopsRunawayLoops) {
  ChatTemplate::Options options;
  options.max_steps = 100000;
  auto t = ChatTemplate::Create(
      "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", options);
  ASSERT_TRUE(t.ok()) << t.status();
  auto out = (*t)->Render(json::object());
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::StrContains(out.status().message(), "budget")) << out.status();
}

TEST(ChatTemplateTest, StringDoublingIsBounded) {
  auto out = RenderText(
      "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}{{ ns.s|length }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, OutputLimit) {
  ChatTemplate::Options options;
  options.max_output_bytes = 1000;
  auto t = ChatTemplate::Create("{% for i in range(2000) %}x{% endfor %}", options);
  ASSERT_TRUE(t.ok());
  auto out = (*t)->Render(json::object());
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::StrContains(out.status().message(), "output limit")) << out.status();
}

TEST(ChatTemplateTest, DeepMacroRecursionFailsCleanly) {
  auto out = RenderText("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::StrContains(out.status().message(), "nesting limit")) << out.status();
}

TEST(ChatTemplateTest, DeepExpressionNestingRejectedAtLoad) {
  std::string src = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  auto t = ChatTemplate::Create(src);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::StrContains(t.status().message(), "nesting")) << t.status();
  std::string nots = "{{ " + std::string(0, ' ');
  for (int i = 0; i < 5000; ++i) nots += "not ";
  nots += "1 }}";
  EXPECT_FALSE(ChatTemplate::Create(nots).ok());
  std::string ifs;
  for (int i = 0; i < 500; ++i) ifs += "{% if 1 %}";
  for (int i = 0; i < 500; ++i) ifs += "{% endif %}";
  EXPECT_FALSE(ChatTemplate::Create(ifs).ok());
}

TEST(ChatTemplateTest, DeeplyNestedValuesAreRejected) {
  auto out = RenderText(
      "{% set ns = namespace(v=[]) %}{% for i in range(1000) %}{% set ns.v = [ns.v] %}"
      "{% endfor %}{{ ns.v }}");
  ASSERT_FALSE(out.ok());
  json deep = json::array();
  for (int i = 0; i < 1000; ++i) deep = json::array({deep});
  auto t = ChatTemplate::Create("{{ x }}");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE((*t)->Render(json{{"x", deep}}).ok());
}

TEST(ChatTemplateTest, ConcurrentRendersAgree) {
  auto t = ChatTemplate::Create(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{{ m.role }}:{{ m.content }};{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(t.ok());
  const json ctx = {{"messages", {{{"role", "user"}, {"content", "a"}},
                                  {{"role", "assistant"}, {"content", "b"}}}}};
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 200; ++k) {
        auto out = (*t)->Render(ctx);
        if (!out.ok() || *out != "user:a;assistant:b;2") ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(LoadChatTemplateTest, StringTemplate) {
  auto t = LoadChatTemplate(json{{"chat_template", "{{ bos_token }}hi"}}, false);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->Render(json{{"bos_token", "<s>"}}), "<s>hi");
}

TEST(LoadChatTemplateTest, NamedTemplates) {
  const json config = {{"chat_template",
                        {{{"name", "default"}, {"template", "D"}},
                         {{"name", "tool_use"}, {"template", "T"}}}}};
  auto plain = LoadChatTemplate(config, false);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(*(*plain)->Render(json::object()), "D");
  auto tools = LoadChatTemplate(config, true);
  ASSERT_TRUE(tools.ok()) << tools.status();
  EXPECT_EQ(*(*tools)->Render(json::object()), "T");

  const json only_default = {{"chat_template", {{{"name", "default"}, {"template", "D"}}}}};
  EXPECT_EQ(*(*LoadChatTemplate(only_default, true))->Render(json::object()), "D");

  const json no_default = {{"chat_template", {{{"name", "rag"}, {"template", "R"}}}}};
  auto missing = LoadChatTemplate(no_default, false);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "rag")) << missing.status();
}

TEST(LoadChatTemplateTest, MissingOrMalformed) {
  EXPECT_EQ(LoadChatTemplate(json::object(), false).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadChatTemplate(json{{"chat_template", 3}}, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadChatTemplate(json{{"chat_template", {{{"name", 1}}}}}, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadChatTemplate(json{{"chat_template", "{{ x|nope }}"}}, false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer::engine
