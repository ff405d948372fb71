"""Foundations every other part may import: one-line user errors (`errors`), workdir paths local or
remote (`paths`), the tolerant readers of a run's own files (`run_files`), checkpoint digests
(`digests`) and the allowed ranges settings declare (`ranges`). They import nothing else from the
package."""
