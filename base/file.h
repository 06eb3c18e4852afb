/* Writing a file a user named (PLAIT_TOPO_DUMP_FILE, PLAIT_DEBUG_FILE,
 * plait-tune --out, plait-topo --dump, a perf tool's -J), as a user expects
 * of any program given a path:
 *
 *   - a symbolic link is followed: what it points to is written, the link stays;
 *   - /dev/stdout, /dev/stderr, /dev/fd/N and /proc/self/fd/N are this
 *     process's open descriptor N, written where it stands (not reopened, so a
 *     redirected stdout is neither truncated nor overwritten from its start);
 *   - a FIFO is opened without blocking and written: a FIFO nobody reads is an
 *     error at once, never a wait;
 *   - a character device (/dev/null, a terminal) is written directly;
 *   - a regular file, or a path where nothing is yet, is written whole
 *     (plait_file_write: a temporary file in the target's own directory,
 *     renamed over it, so that a reader never sees half a file and writers in
 *     several processes leave one whole copy) and keeps its permission bits
 *     (and owner, where the caller may set it); where no temporary can be
 *     made beside it (a directory this process may not write, a name too
 *     near NAME_MAX for the temporary's), the file itself is written;
 *   - anything else (a directory, a block device, a socket) is refused.
 *
 * Self-contained (no logging, no last-error string): libnccl.so.2 compiles it
 * too. Every function fills `why` (what failed, with the path and the OS
 * error) on failure. Thread-safe. */
#ifndef PLAIT_FILE_H
#define PLAIT_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Writes `len` bytes of `data` as the whole contents of `path`. Returns 0, or
 * -1 with `why` set. */
int plait_file_write(const char *path, const void *data, size_t len, char *why, size_t why_len);

/* Opens `path` for writing over time (a log, JSON lines): appended to when
 * `is_append`, else truncated; a regular file is written in place (no
 * temporary: the caller writes as it goes). Returns a stream the caller
 * closes, or NULL with `why` set. */
FILE *plait_file_open(const char *path, bool is_append, char *why, size_t why_len);

#endif
