// Libraries too big to ship inside every widget's state (plotly.js 4.7 MB) are loaded
// once per page. An offline page defines globalThis.etlabLibs[name] (the source) before its views
// run; in a notebook the first view that needs one asks its kernel (a custom widget message) and
// every other view of the page waits for the same answer.

function sharedLibrary(model, name) {
  const libs = (globalThis.etlabLibs = globalThis.etlabLibs || {});
  if (typeof libs[name] === "string") return Promise.resolve(libs[name]);
  if (libs[name]) return libs[name]; // already asked for: the pending answer
  if (!model || typeof model.send !== "function") return Promise.reject(new Error(`${name} is not in this page`));
  const pending = new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      model.off("msg:custom", onMsg);
      if (libs[name] === pending) delete libs[name]; // a later view may ask again
      reject(new Error(`the kernel did not send ${name}: run the cell again (a saved notebook shows its static copy)`));
    }, 30000);
    function onMsg(msg) {
      if (!msg || msg.type !== "etlab:library" || msg.name !== name) return;
      clearTimeout(timer);
      model.off("msg:custom", onMsg);
      libs[name] = msg.source;
      resolve(msg.source);
    }
    model.on("msg:custom", onMsg);
    model.send({ type: "etlab:need-library", name });
  });
  libs[name] = pending;
  return pending;
}
