// Libraries too big to ship inside every widget's state (plotly.js 4.7 MB) are loaded once per page,
// from the first source that has them:
//  1. the page itself: an offline page defines globalThis.etlabLibs[name] (the source) before its views run;
//  2. the Jupyter server: with etlab's server extension (JupyterLab from `make lab` or `pip install etlab`)
//     GET <base>/etlab/modules/<name>.js answers at once, whatever the kernel is doing (a Run All keeps
//     the kernel busy for minutes, and a chart must not depend on it);
//  3. the kernel (a custom widget message), as a last resort: the kernel answers once the cells queued
//     before it have run, so the view waits (saying so) and asks again now and then, with no deadline
//     that would leave a chart broken behind a busy kernel.
// Every view of the page shares the one pending load.

const ETLAB_RETRY_MS = 15000;

function jupyterServer() {
  // JupyterLab / Notebook 7 put their settings (base URL, token) in the page
  const el = typeof document !== "undefined" && document.getElementById("jupyter-config-data");
  if (!el) return null;
  try {
    const config = JSON.parse(el.textContent || "{}");
    return config.baseUrl ? { baseUrl: config.baseUrl, token: config.token || "" } : null;
  } catch (err) {
    return null;
  }
}

async function fromServer(name) {
  const server = jupyterServer();
  if (!server || typeof fetch !== "function") return null;
  const url = server.baseUrl.replace(/\/?$/, "/") + `etlab/modules/${encodeURIComponent(name)}.js`;
  try {
    const response = await fetch(url, {
      credentials: "same-origin",
      headers: server.token ? { Authorization: `token ${server.token}` } : {},
    });
    if (!response.ok) return null; // no etlab server extension here: the kernel sends it
    return await response.text();
  } catch (err) {
    return null;
  }
}

function fromKernel(model, name, onWait) {
  return new Promise((resolve) => {
    let asked = 0;
    const ask = () => {
      asked += 1;
      if (asked > 1 && onWait) {
        onWait(`waiting for the kernel to send ${name} (it answers once the cells before this one have run)…`);
      }
      model.send({ type: "etlab:need-library", name });
    };
    const timer = setInterval(ask, ETLAB_RETRY_MS);
    function onMsg(msg) {
      if (!msg || msg.type !== "etlab:library" || msg.name !== name) return;
      clearInterval(timer);
      model.off("msg:custom", onMsg);
      resolve(msg.source);
    }
    model.on("msg:custom", onMsg);
    ask();
  });
}

export function sharedLibrary(model, name, onWait) {
  const libs = (globalThis.etlabLibs = globalThis.etlabLibs || {});
  if (typeof libs[name] === "string") return Promise.resolve(libs[name]);
  if (libs[name]) return libs[name]; // already asked for: the pending answer
  const canAskKernel = model && typeof model.send === "function";
  const pending = fromServer(name).then((source) => {
    if (source !== null) return source;
    if (!canAskKernel) throw new Error(`${name} is not in this page`);
    return fromKernel(model, name, onWait);
  });
  libs[name] = pending.then((source) => {
    libs[name] = source;
    return source;
  }, (err) => {
    delete libs[name]; // a later view may ask again
    throw err;
  });
  return libs[name];
}
