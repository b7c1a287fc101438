// Two adjustments so the ipywidgets HTML manager works from the book's own files, offline.
// 1. RequireJS reads a global `require` defined before it loads as its configuration: map the widget
//    manager's module path to the copy served in _static/vendor, so its fonts load from there too.
// 2. The manager (1.x) typesets widget labels through MathJax 2's API, MathJax.Hub.Queue, but the book
//    loads MathJax 3, which has no Hub: give every MathJax object a small Hub that forwards "Typeset"
//    jobs to MathJax 3's typesetPromise.
(function () {
  const here = document.currentScript && document.currentScript.src;
  if (here && typeof window.require === "undefined") {
    window.require = {
      paths: {
        "@jupyter-widgets/html-manager/dist": new URL("vendor/npm/@jupyter-widgets/html-manager/dist", here).href,
      },
    };
  }
  const hub = {
    Queue: function (...jobs) {
      for (const job of jobs) {
        const mj = window.MathJax;
        if (Array.isArray(job) && job[0] === "Typeset" && mj && mj.typesetPromise) {
          mj.typesetPromise(job[2] ? [job[2]] : undefined).catch(function () {});
        }
      }
    },
  };
  const withHub = function (v) {
    if (v && typeof v === "object" && !v.Hub) {
      Object.defineProperty(v, "Hub", { value: hub, enumerable: false, configurable: true });
    }
    return v;
  };
  let current = withHub(window.MathJax);
  Object.defineProperty(window, "MathJax", {
    configurable: true,
    get: function () { return current; },
    set: function (v) { current = withHub(v); },
  });
})();
