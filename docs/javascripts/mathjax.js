// MathJax 3 configuration for pymdownx.arithmatex (generic mode): typeset only what arithmatex marked,
// \( ... \) inline and \[ ... \] displayed. The MathJax script itself is the site's own copy
// (assets/mathjax/tex-svg.js, put there by docs/hooks.py): nothing is fetched from elsewhere.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
  svg: { fontCache: "global" },
};

// Material's instant navigation swaps the page without reloading scripts: typeset each new page.
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (window.MathJax && MathJax.typesetPromise) {
      MathJax.startup.output.clearCache();
      MathJax.typesetClear();
      MathJax.texReset();
      MathJax.typesetPromise();
    }
  });
}
