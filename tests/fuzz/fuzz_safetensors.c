/*
 * fuzz_safetensors.c - the safetensors reader (dsq_st_open_file) on arbitrary
 * bytes.
 *
 * lib/safetensors.c has no from-memory entry point (it maps a path), so the
 * input goes into an anonymous memfd opened through /proc/self/fd (no disk
 * traffic, nothing to clean up), or into a temp file where memfd is missing.
 * An accepted file is then walked completely: every tensor must lie inside
 * the input and the tensors together can not be larger than the data section.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A path whose contents are data[0..size); *fd_out / *tmp_out to release. */
static int make_file(const uint8_t *data, size_t size, char *path, size_t cap, int *fd_out,
                     int *is_tmp)
{
    *is_tmp = 0;
    int fd = memfd_create("dsq_fuzz_st", MFD_CLOEXEC);
    if (fd >= 0) {
        snprintf(path, cap, "/proc/self/fd/%d", fd);
    } else {
        const char *base = getenv("TMPDIR");
        snprintf(path, cap, "%s/dsq_fuzz_st_XXXXXX", base && *base ? base : "/tmp");
        fd = mkstemp(path);
        if (fd < 0)
            return -1;
        *is_tmp = 1;
    }
    if (write_all(fd, data, size) != 0) {
        close(fd);
        if (*is_tmp)
            unlink(path);
        return -1;
    }
    *fd_out = fd;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[4096];
    int fd = -1, is_tmp = 0;
    if (make_file(data, size, path, sizeof path, &fd, &is_tmp) != 0)
        return 0;

    dsq_st_set *set = (dsq_st_set *)1;
    dsq_status st = dsq_st_open_file(path, &set);
    if (st != DSQ_OK) {
        if (set != NULL || dsq_last_error_message()[0] == '\0')
            abort(); /* *out cleared and the refusal explained */
    } else {
        int32_t n = dsq_st_count(set);
        uint64_t total = 0;
        volatile uint8_t sink = 0;
        for (int32_t i = 0; i < n; i++) {
            const dsq_st_entry *e = dsq_st_at(set, i);
            if (!e || !e->name || dsq_st_find(set, e->name) != e)
                abort();
            if (e->t.ndim < 0 || e->t.ndim > DSQ_MAX_DIMS)
                abort();
            size_t es = dsq_dtype_size(e->t.dtype);
            if (es && (uint64_t)dsq_tensor_numel(&e->t) * es != e->t.nbytes)
                abort();
            total += e->t.nbytes;
            /* Touch every byte: a view past the mapping faults here. */
            const uint8_t *p = e->t.data;
            for (size_t b = 0; b < e->t.nbytes; b++)
                sink ^= p[b];
        }
        (void)sink;
        if (dsq_st_at(set, n) != NULL || dsq_st_at(set, -1) != NULL)
            abort();
        if (size < 8 || total > size - 8)
            abort();
        dsq_st_close(set);
    }
    close(fd);
    if (is_tmp)
        unlink(path);
    return 0;
}
