/* util.c - files, paths, half-precision conversions, params copying. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

size_t dsq_dtype_size(dsq_dtype dt)
{
    switch (dt) {
    case DSQ_DT_F32: return 4;
    case DSQ_DT_F16:
    case DSQ_DT_BF16: return 2;
    default: return 0;
    }
}

const char *dsq_dtype_name(dsq_dtype dt)
{
    switch (dt) {
    case DSQ_DT_F32: return "F32";
    case DSQ_DT_F16: return "F16";
    case DSQ_DT_BF16: return "BF16";
    default: return "other";
    }
}

int64_t dsq_tensor_numel(const dsq_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

dsq_status dsq_read_file(const char *path, char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    /* Only regular files are read.  O_NONBLOCK first, fstat second: a FIFO
     * (or a device) would block in a plain open() until a writer appears,
     * and checking the path with stat() before opening it races with its
     * replacement.  A directory opens fine but is refused the same way. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return dsq_fail(DSQ_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return dsq_fail(DSQ_ERR_IO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return dsq_fail(DSQ_ERR_IO, "'%s' is not a regular file", path);
    }
    if (sb.st_size < 0 || (uint64_t)sb.st_size >= (uint64_t)SIZE_MAX) {
        close(fd);
        return dsq_fail(DSQ_ERR_IO, "'%s' is too large to read", path);
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for '%s' (%zu bytes)", path, n);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (got != n) {
        free(buf);
        return dsq_fail(DSQ_ERR_IO, "short read on '%s' (%zu of %zu bytes)", path, got, n);
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return DSQ_OK;
}

char *dsq_path_join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 2);
    if (!s)
        return NULL;
    memcpy(s, a, la);
    size_t k = la;
    if (la > 0 && a[la - 1] != '/')
        s[k++] = '/';
    memcpy(s + k, b, lb + 1);
    return s;
}

int dsq_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int dsq_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int dsq_path_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

int dsq_n_cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

float dsq_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 */
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    if (exp == 31)
        v.u = sign | 0x7f800000u | (man << 13);
    else
        v.u = sign | ((exp + 112) << 23) | (man << 13);
    return v.f;
}

uint16_t dsq_f32_to_f16(float f)
{
    union { uint32_t u; float f; } v = { .f = f };
    uint32_t sign = (v.u >> 16) & 0x8000;
    uint32_t a = v.u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf / nan */
        return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0));
    if (a >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00);
    if (a < 0x38800000u) { /* below the smallest normal half: subnormal */
        float af;
        union { uint32_t u; float f; } w = { .u = a };
        af = w.f;
        /* nearbyint with default rounding mode = round half to even */
        uint32_t m = (uint32_t)nearbyintf(af * 16777216.0f);
        return (uint16_t)(sign | m);
    }
    uint32_t e = ((a >> 23) - 112) << 10;
    uint32_t m = (a >> 13) & 0x3ff;
    uint32_t rest = a & 0x1fff;
    uint32_t h = e | m;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++; /* may carry into the exponent, which is the right result */
    return (uint16_t)(sign | h);
}

uint16_t dsq_f32_to_bf16(float f)
{
    union { uint32_t u; float f; } v = { .f = f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((v.u >> 16) | 0x40);
    uint32_t r = 0x7fff + ((v.u >> 16) & 1);
    return (uint16_t)((v.u + r) >> 16);
}

dsq_status dsq_copy_params(void *dst, size_t dst_size, const void *src, size_t min_size,
                           const char *what)
{
    if (!src)
        return DSQ_OK; /* keep defaults */
    uint32_t given;
    memcpy(&given, src, sizeof given);
    if (given < min_size || given > dst_size)
        return dsq_fail(DSQ_ERR_STRUCT_SIZE,
                        "%s.struct_size is %u; this library accepts %zu..%zu "
                        "(set it with sizeof or %s_init())",
                        what, given, min_size, dst_size, what);
    memcpy(dst, src, given);
    /* struct_size reports what the library now holds */
    uint32_t full = (uint32_t)dst_size;
    memcpy(dst, &full, sizeof full);
    return DSQ_OK;
}

dsq_status dsq_params_init(void *dst, uint32_t size, const void *defaults, size_t full,
                           size_t min_size, const char *what)
{
    dsq_clear_error();
    if (!dst)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "%s_init: params is NULL", what);
    if (size < min_size || size > full)
        return dsq_fail(DSQ_ERR_STRUCT_SIZE, "%s_init: struct_size %u; this library accepts %zu..%zu",
                        what, size, min_size, full);
    memcpy(dst, defaults, size);
    memcpy(dst, &size, sizeof size);
    return DSQ_OK;
}
