"""The chat page at `/`: one self-contained HTML document (inline CSS and script, no external assets).

It lists models from `/v1/models`, streams answers from `/v1/chat/completions` (fetch + SSE
parsing), keeps the conversation in memory for multi-turn chats, stops a generation with an
AbortController (the gateway then closes the session on every peer) and shows tokens/s. Model
text is only ever set with `textContent`, never as HTML. Narrow screens get a single column.
"""

from __future__ import annotations

CSS = """
*{box-sizing:border-box}
body{margin:0;font:16px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;background:#f4f5f7;color:#1d2330;
  display:flex;flex-direction:column;height:100vh;height:100dvh}
header{display:flex;gap:.6rem;align-items:center;padding:.6rem 1rem;background:#1d2330;color:#fff;flex-wrap:wrap}
header h1{font-size:1.05rem;margin:0 auto 0 0}
select,input,textarea,button{font:inherit}
select,input{padding:.3rem .4rem;border-radius:6px;border:1px solid #9aa3b5;max-width:100%}
#log{flex:1;overflow-y:auto;padding:1rem;display:flex;flex-direction:column;gap:.7rem}
.msg{max-width:48rem;padding:.6rem .8rem;border-radius:10px;white-space:pre-wrap;word-wrap:break-word}
.user{align-self:flex-end;background:#2f6fed;color:#fff}
.assistant{align-self:flex-start;background:#fff;border:1px solid #dde1e8}
.error{align-self:center;background:#fdecea;color:#8a1c12;border:1px solid #f3b7ae}
.meta{font-size:.78rem;color:#6a7385;margin-top:.3rem}
form{display:flex;gap:.5rem;padding:.7rem 1rem;background:#fff;border-top:1px solid #dde1e8}
textarea{flex:1;resize:none;min-height:2.6rem;max-height:10rem;padding:.5rem;border-radius:8px;border:1px solid #9aa3b5}
button{padding:.5rem 1rem;border:0;border-radius:8px;background:#2f6fed;color:#fff;cursor:pointer}
button.secondary{background:#6a7385}
button[hidden],#keybox[hidden]{display:none}
#status{font-size:.8rem;color:#c9cfdb}
@media (max-width:600px){header h1{width:100%}.msg{max-width:100%}form{padding:.5rem}}
"""

SCRIPT = r"""
const $ = (id) => document.getElementById(id);
const log = $("log"), input = $("input"), send = $("send"), stop = $("stop"), picker = $("model");
let history = [], controller = null;

function headers() {
  const h = {"Content-Type": "application/json"};
  const key = $("key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}
function bubble(cls, text) {
  const div = document.createElement("div");
  div.className = "msg " + cls;
  div.textContent = text;
  log.appendChild(div);
  log.scrollTop = log.scrollHeight;
  return div;
}
function status(text) { $("status").textContent = text; }
async function errorText(response) {
  try { return (await response.json()).error.message; } catch (e) { return response.status + " " + response.statusText; }
}
async function loadModels() {
  try {
    const r = await fetch("/v1/models", {headers: headers()});
    if (r.status === 401) { $("keybox").hidden = false; status("an API key is needed"); return; }
    const data = (await r.json()).data || [];
    const chosen = picker.value;
    picker.replaceChildren(...data.map((m) => { const o = document.createElement("option"); o.value = o.textContent = m.id; return o; }));
    if (chosen) picker.value = chosen;
    status(data.length ? "ready" : "no model is served end to end right now; retrying");
    if (!data.length) setTimeout(loadModels, 3000);
  } catch (e) { status("cannot reach the gateway: " + e); setTimeout(loadModels, 3000); }
}
async function ask(text) {
  history.push({role: "user", content: text});
  bubble("user", text);
  const out = bubble("assistant", "");
  out.dataset.state = "streaming";
  const meta = document.createElement("div");
  meta.className = "meta";
  controller = new AbortController();
  send.hidden = true; stop.hidden = false;
  const started = performance.now();
  let first = null, tokens = 0, answer = "", reason = "";
  try {
    const r = await fetch("/v1/chat/completions", {method: "POST", headers: headers(), signal: controller.signal,
      body: JSON.stringify({model: picker.value, messages: history, stream: true,
                            stream_options: {include_usage: true}, max_tokens: Number($("max").value) || 256})});
    if (!r.ok) {
      if (r.status === 401) $("keybox").hidden = false;
      throw new Error(await errorText(r));
    }
    const reader = r.body.getReader(), decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const line = buffer.slice(0, cut).trim(); buffer = buffer.slice(cut + 2);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const chunk = JSON.parse(line.slice(6));
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.usage) tokens = chunk.usage.completion_tokens;
        const choice = (chunk.choices || [])[0];
        if (!choice) continue;
        if (choice.delta && choice.delta.content) {
          if (first === null) first = performance.now();
          if (!chunk.usage) tokens += 1;
          answer += choice.delta.content;
          out.textContent = answer;
          log.scrollTop = log.scrollHeight;
        }
        if (choice.finish_reason) reason = choice.finish_reason;
      }
    }
  } catch (e) {
    if (e.name === "AbortError") reason = "stopped";
    else { bubble("error", String(e.message || e)); reason = "error"; }
  } finally {
    const secs = (performance.now() - (first || started)) / 1000;
    const rate = tokens > 1 && first !== null ? ((tokens - 1) / secs).toFixed(1) : "–";
    meta.textContent = `${tokens} tokens · ${rate} tokens/s · first token ${first === null ? "–" : ((first - started) / 1000).toFixed(2) + " s"} · ${reason}`;
    out.appendChild(meta);
    out.dataset.state = "done";
    if (answer) history.push({role: "assistant", content: answer});
    else if (reason !== "stopped") history.pop();
    controller = null; send.hidden = false; stop.hidden = true;
    input.focus();
  }
}
$("chat").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = input.value.trim();
  if (!text || controller || !picker.value) return;
  input.value = "";
  ask(text);
});
input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("chat").requestSubmit(); }
});
stop.addEventListener("click", () => { if (controller) controller.abort(); });
$("clear").addEventListener("click", () => { history = []; log.replaceChildren(); });
$("key").addEventListener("change", loadModels);
loadModels();
"""


def render_page(nonce: str) -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>layerswarm chat</title><style>{CSS}</style></head>
<body>
<header><h1>layerswarm chat</h1>
<label>model <select id="model" aria-label="model"></select></label>
<label>max tokens <input id="max" type="number" min="1" value="256" style="width:5rem"></label>
<span id="keybox" hidden><input id="key" type="password" placeholder="API key" aria-label="API key"></span>
<button id="clear" class="secondary" type="button">New chat</button>
<span id="status">loading models…</span></header>
<main id="log" aria-live="polite"></main>
<form id="chat"><textarea id="input" rows="1" placeholder="Message" title="Enter sends, Shift+Enter starts a new line" aria-label="message"></textarea>
<button id="send" type="submit">Send</button><button id="stop" type="button" class="secondary" hidden>Stop</button></form>
<script nonce="{nonce}">{SCRIPT}</script>
</body></html>
"""
