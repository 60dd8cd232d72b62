"""The page's CSS and JavaScript, inlined into every response so the page works offline.

No CDN, no web font: the system font stack. The script only re-fetches the page and swaps in
the server-rendered (already escaped) content, so escaping lives in one place: page.py.
"""

CSS = """
:root{--bg:#f5f6f8;--card:#fff;--ink:#1d232b;--muted:#687384;--line:#e3e6eb;
--c0:#d9434b;--c1:#f0a93b;--c2:#8fcf7e;--c3:#2e9e4f;--join:#4d7fe0;--accent:#2f6fde}
@media (prefers-color-scheme:dark){:root{--bg:#13161b;--card:#1c2027;--ink:#e6e9ee;
--muted:#9aa4b2;--line:#2c323b}}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.45 system-ui,-apple-system,
"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
header{display:flex;flex-wrap:wrap;align-items:center;gap:8px 16px;padding:14px 20px;
background:var(--card);border-bottom:1px solid var(--line)}
header h1{font-size:17px;margin:0;font-weight:650;letter-spacing:-.01em}
header h1 span{color:var(--muted);font-weight:500}
.status{margin-left:auto;display:flex;align-items:center;gap:8px;color:var(--muted);font-size:13px}
.dot{width:9px;height:9px;border-radius:50%;background:var(--c3);flex:none}
.status.stale .dot{background:var(--c1)}
.status.down .dot{background:var(--c0)}
main{max-width:1280px;margin:0 auto;padding:18px 16px 40px}
.banner{background:#fff4e0;color:#7a4b00;border:1px solid #f3d19c;border-radius:8px;
padding:10px 14px;margin-bottom:16px}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:16px 18px;
margin-bottom:18px;box-shadow:0 1px 2px rgba(0,0,0,.04)}
.head{display:flex;flex-wrap:wrap;align-items:center;gap:8px 12px}
.head h2{font-size:16px;margin:0;word-break:break-all}
.badge{display:inline-block;border-radius:999px;padding:2px 10px;font-size:12px;font-weight:650;
letter-spacing:.02em;text-transform:uppercase}
.badge.healthy{background:#dff3e4;color:#17683a}.badge.broken{background:#fbe1e2;color:#9b1c24}
.kpis{display:grid;grid-template-columns:repeat(auto-fit,minmax(120px,1fr));gap:10px;margin:14px 0}
.kpi{border:1px solid var(--line);border-radius:8px;padding:8px 10px}
.kpi b{display:block;font-size:18px;font-weight:650}
.kpi span{color:var(--muted);font-size:12px}
.bar{display:flex;gap:2px;height:26px;margin:6px 0 4px}
.cell{flex:1 1 0;min-width:2px;border-radius:3px;background:var(--c0)}
.cell.n1{background:var(--c1)}.cell.n2{background:var(--c2)}.cell.n3{background:var(--c3)}
.cell.join{background:repeating-linear-gradient(45deg,var(--c0) 0 4px,var(--join) 4px 8px)}
.cell.withjoin{box-shadow:inset 0 -5px 0 var(--join)}
.axis{display:flex;justify-content:space-between;color:var(--muted);font-size:11px}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;color:var(--muted);font-size:12px;margin:8px 0 2px}
.legend i{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:5px;
vertical-align:-1px}
.gaps{color:var(--c0);font-weight:600;margin:6px 0 0}
.tablewrap{overflow-x:auto;margin-top:14px}
table{width:100%;border-collapse:collapse;font-size:13px}
th{text-align:left;font-weight:600;color:var(--muted);font-size:12px;border-bottom:1px solid var(--line);
padding:6px 8px;white-space:nowrap}
td{padding:7px 8px;border-bottom:1px solid var(--line);vertical-align:middle}
tr:last-child td{border-bottom:0}
tr.down td{opacity:.62}tr.down td:last-child{opacity:1}
th.num{text-align:right}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.name{font-weight:600;word-break:break-word}
.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
.muted{color:var(--muted)}
.range{position:relative;height:10px;min-width:90px;background:var(--line);border-radius:5px}
.range span{position:absolute;top:0;bottom:0;background:var(--accent);border-radius:5px}
.rangetext{font-size:11px;color:var(--muted)}
.pill{display:inline-block;border-radius:5px;padding:1px 7px;font-size:12px;font-weight:600}
.pill.online{background:#dff3e4;color:#17683a}.pill.joining{background:#e2eafb;color:#2449a0}
.pill.offline{background:#eceef1;color:#505a67}
.ok{color:#17683a;font-weight:600}.bad{color:#b4232b;font-weight:600}
.err{display:block;color:var(--muted);font-size:11px;max-width:260px;word-break:break-word}
.empty{color:var(--muted);text-align:center;padding:40px 0}
footer{color:var(--muted);font-size:12px;text-align:center;padding:0 16px 24px}
footer a{color:var(--muted)}
@media (max-width:720px){
header{padding:12px}.status{margin-left:0;width:100%}
main{padding:12px 8px 32px}.card{padding:12px}
thead{display:none}table,tbody{display:block;width:100%}
tr{display:grid;grid-template-columns:1fr 1fr;gap:2px 14px;border:1px solid var(--line);
border-radius:8px;margin-bottom:10px;padding:8px 12px}
td{display:block;border:0;padding:3px 0;min-width:0}
td::before{content:attr(data-label);display:block;color:var(--muted);font-size:11px}
td.num{text-align:left}td.wide{grid-column:1/-1}
.err{max-width:none}}
"""

# Re-fetch the page (same URL, so a ?model= filter sticks) and swap the content in. The HTML
# comes from our own server, already escaped, and DOMParser never runs scripts it parses.
JS = """
(function(){
  var root=document.getElementById('content');
  var every=Math.max(1,parseFloat(root.dataset.refresh||'10'))*1000;
  var status=document.getElementById('status'), text=document.getElementById('status-text');
  var loadedAt=Date.now();
  function tick(){
    var c=document.getElementById('content'), age=parseFloat(c.dataset.age);
    var stale=c.dataset.stale==='true';
    if(status.classList.contains('down')) return;
    if(isNaN(age)){text.textContent='waiting for the first refresh';return;}
    var s=Math.round(age+(Date.now()-loadedAt)/1000);
    text.textContent=(stale?'stale, updated ':'updated ')+s+' s ago';
    status.className='status'+(stale?' stale':'');
  }
  function refresh(){
    fetch(location.pathname+location.search,{cache:'no-store'}).then(function(r){
      if(!r.ok) throw new Error('HTTP '+r.status);
      return r.text();
    }).then(function(html){
      var doc=new DOMParser().parseFromString(html,'text/html');
      var fresh=doc.getElementById('content');
      if(!fresh) throw new Error('bad page');
      document.getElementById('content').replaceWith(document.importNode(fresh,true));
      loadedAt=Date.now(); status.className='status'; tick();
    }).catch(function(e){
      status.className='status down';
      text.textContent='monitor unreachable ('+e.message+'), retrying';
    });
  }
  tick(); setInterval(tick,1000); setInterval(refresh,every);
})();
"""
