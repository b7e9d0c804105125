// A small Markdown renderer for the answers (ours, no dependency): fenced code blocks with
// keyword highlighting, headings, lists, block quotes, paragraphs, and inline code, bold,
// italic and http(s) links. Everything is HTML-escaped first, so the model's text never
// becomes markup of its own.
"use strict";

(function () {
  const KEYWORDS = new Set((
    "def class return if elif else for while in not and or is None True False import from as with try except " +
    "finally raise lambda yield pass break continue global async await function const let var new this null " +
    "undefined true false typeof instanceof switch case default do throw catch export extends static fn pub " +
    "struct impl enum match mut use mod trait where int float double char void long short unsigned signed " +
    "bool string package func go chan map type interface select defer echo then fi done esac local SELECT FROM " +
    "WHERE INSERT UPDATE DELETE JOIN ON GROUP BY ORDER LIMIT"
  ).split(" "));

  // one pass over the code: comments, strings, numbers, words (in that order of precedence)
  const TOKEN = /(\/\/[^\n]*|#[^\n]*|--[^\n]*|\/\*[\s\S]*?\*\/)|("(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|`(?:\\.|[^`\\])*`)|(\b\d+(?:\.\d+)?\b)|([A-Za-z_][A-Za-z0-9_]*)/g;

  function escapeHtml(s) {
    return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
  }

  function highlight(code, lang) {
    const hashComments = /^(py|python|sh|bash|shell|ruby|rb|r|yaml|yml|toml|perl)$/i.test(lang || "");
    const dashComments = /^(sql|lua|haskell|hs)$/i.test(lang || "");
    let out = "", last = 0, m;
    TOKEN.lastIndex = 0;
    while ((m = TOKEN.exec(code)) !== null) {
      let cls = null;
      if (m[1]) {
        const c = m[1];
        if ((c[0] === "#" && !hashComments) || (c[0] === "-" && !dashComments)) {
          TOKEN.lastIndex = m.index + 1;  // not a comment in this language: read on after its first character
          continue;
        }
        cls = "tok-com";
      } else if (m[2]) cls = "tok-str";
      else if (m[3]) cls = "tok-num";
      else if (m[4] && KEYWORDS.has(m[4])) cls = "tok-kw";
      if (!cls) continue;
      out += escapeHtml(code.slice(last, m.index)) + `<span class="${cls}">${escapeHtml(m[0])}</span>`;
      last = m.index + m[0].length;
    }
    return out + escapeHtml(code.slice(last));
  }

  function inline(text) {
    const parts = text.split(/(`[^`\n]+`)/);
    return parts.map((part, i) => {
      if (i % 2 === 1) return `<code>${escapeHtml(part.slice(1, -1))}</code>`;
      let s = escapeHtml(part);
      s = s.replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>");
      s = s.replace(/(^|[^*\w])\*([^*\n]+)\*(?!\*)/g, "$1<em>$2</em>");
      s = s.replace(/(^|[^\w])_([^_\n]+)_(?!\w)/g, "$1<em>$2</em>");
      s = s.replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s)"]+)\)/g,
        '<a href="$2" rel="noopener noreferrer" target="_blank">$1</a>');
      return s;
    }).join("");
  }

  function renderMarkdown(src) {
    const lines = String(src || "").replace(/\r\n?/g, "\n").split("\n");
    const html = [];
    let para = [], list = null;
    const flushPara = () => {
      if (para.length) html.push(`<p>${inline(para.join(" "))}</p>`);
      para = [];
    };
    const flushList = () => {
      if (list) html.push(`<${list.tag}>${list.items.map((it) => `<li>${inline(it)}</li>`).join("")}</${list.tag}>`);
      list = null;
    };
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      const fence = line.match(/^\s*```\s*([\w+-]*)\s*$/);
      if (fence) {
        flushPara(); flushList();
        const body = [];
        i++;
        while (i < lines.length && !/^\s*```\s*$/.test(lines[i])) body.push(lines[i++]);
        const lang = fence[1] || "";
        html.push(`<pre class="code"${lang ? ` data-lang="${escapeHtml(lang)}"` : ""}><code>` +
          `${highlight(body.join("\n"), lang)}</code></pre>`);
        continue;
      }
      const heading = line.match(/^(#{1,6})\s+(.*)$/);
      const bullet = line.match(/^\s*[-*+]\s+(.*)$/);
      const numbered = line.match(/^\s*\d+[.)]\s+(.*)$/);
      const quote = line.match(/^\s*>\s?(.*)$/);
      if (heading) {
        flushPara(); flushList();
        const level = Math.min(6, heading[1].length + 2);  // an answer's heading sits below the page's own
        html.push(`<h${level}>${inline(heading[2])}</h${level}>`);
      } else if (bullet || numbered) {
        flushPara();
        const tag = bullet ? "ul" : "ol";
        if (!list || list.tag !== tag) { flushList(); list = { tag, items: [] }; }
        list.items.push((bullet || numbered)[1]);
      } else if (quote) {
        flushPara(); flushList();
        html.push(`<blockquote>${inline(quote[1])}</blockquote>`);
      } else if (!line.trim()) {
        flushPara(); flushList();
      } else {
        flushList();
        para.push(line.trim());
      }
    }
    flushPara(); flushList();
    return html.join("\n");
  }

  window.tightkvMarkdown = { renderMarkdown, highlight, escapeHtml };
})();
