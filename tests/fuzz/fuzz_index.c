/*
 * fuzz_index.c - a sharded checkpoint: model.safetensors.index.json and two
 * shard files, opened with dsq_st_open_dir() (what dsq_model_load() does
 * with a directory that has no model.safetensors).
 *
 * Input: u16 (little-endian) n0, n0 bytes of index JSON, u16 n1, n1 bytes of
 * shard "a.safetensors", the rest is shard "b.safetensors" (lengths are cut
 * to what is there).  The files are rewritten for each input in one private
 * directory (under /dev/shm when it exists, else $TMPDIR or /tmp), removed
 * at exit.  A refusal must carry a message and leave *out NULL; an accepted
 * set is walked completely: names find themselves, sizes match shape x
 * dtype, every byte of every tensor is read (a view outside its mapping
 * faults).
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "internal.h"

static char g_dir[512];
static const char *const k_files[3] = {"model.safetensors.index.json", "a.safetensors",
                                       "b.safetensors"};

static void cleanup(void)
{
    char p[600];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", g_dir, k_files[i]);
        unlink(p);
    }
    rmdir(g_dir);
}

static const char *work_dir(void)
{
    if (g_dir[0])
        return g_dir;
    struct stat sb;
    const char *base = getenv("TMPDIR");
    if (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) && access("/dev/shm", W_OK) == 0)
        base = "/dev/shm";
    else if (!base || !*base)
        base = "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/dsq_fuzz_index_XXXXXX", base);
    if (!mkdtemp(g_dir)) {
        perror("fuzz_index: mkdtemp");
        abort(); /* a setup problem, not a finding */
    }
    atexit(cleanup);
    return g_dir;
}

static void write_file(const char *dir, const char *name, const uint8_t *p, size_t n)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        abort();
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            abort();
        p += w;
        n -= (size_t)w;
    }
    close(fd);
}

/* Next length-prefixed part of data[*at..size). */
static const uint8_t *part(const uint8_t *data, size_t size, size_t *at, size_t *len)
{
    size_t n = 0;
    if (*at + 2 <= size)
        n = (size_t)data[*at] | (size_t)data[*at + 1] << 8;
    *at = *at + 2 <= size ? *at + 2 : size;
    if (n > size - *at)
        n = size - *at;
    const uint8_t *p = data + *at;
    *at += n;
    *len = n;
    return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = work_dir();
    size_t at = 0, n0, n1;
    const uint8_t *idx = part(data, size, &at, &n0);
    const uint8_t *a = part(data, size, &at, &n1);
    const uint8_t *b = data + at;
    size_t n2 = size - at;
    write_file(dir, k_files[0], idx, n0);
    write_file(dir, k_files[1], a, n1);
    write_file(dir, k_files[2], b, n2);

    dsq_st_set *set = (dsq_st_set *)1;
    dsq_status st = dsq_st_open_dir(dir, &set);
    if (st != DSQ_OK) {
        if (set != NULL || dsq_last_error_message()[0] == '\0' || st == DSQ_ERR_INTERNAL)
            abort();
        return 0;
    }
    int32_t n = dsq_st_count(set);
    volatile uint8_t sink = 0;
    for (int32_t i = 0; i < n; i++) {
        const dsq_st_entry *e = dsq_st_at(set, i);
        if (!e || !e->name || dsq_st_find(set, e->name) != e)
            abort();
        if (e->t.ndim < 0 || e->t.ndim > DSQ_MAX_DIMS || e->file < 0)
            abort();
        size_t es = dsq_dtype_size(e->t.dtype);
        if (es && (uint64_t)dsq_tensor_numel(&e->t) * es != e->t.nbytes)
            abort();
        const uint8_t *p = (const uint8_t *)e->t.data;
        for (size_t k = 0; k < e->t.nbytes; k++)
            sink ^= p[k];
    }
    (void)sink;
    if (dsq_st_at(set, n) != NULL || dsq_st_at(set, -1) != NULL)
        abort();
    dsq_st_close(set);
    return 0;
}
