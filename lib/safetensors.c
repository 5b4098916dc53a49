/*
 * safetensors.c - read-only, memory-mapped, fully validated safetensors files.
 *
 * File layout: u64 little-endian N, then N bytes of UTF-8 JSON (the header,
 * possibly padded with spaces), then the data section.  The header maps each
 * tensor name to {"dtype", "shape", "data_offsets": [begin, end]} with offsets
 * relative to the data section, plus an optional "__metadata__" object of
 * string -> string.
 *
 * Everything the format demands is checked before any tensor is handed out,
 * because the files come from the internet: a hostile header must give
 * DSQ_ERR_FORMAT, never an out-of-bounds read.  Tensors must tile the data
 * section exactly (no overlap, no hole, nothing left over), as the format's
 * reference implementation requires.
 *
 * A set is one file or the shards named by model.safetensors.index.json.
 * Its entries are kept sorted by name so dsq_st_find is a binary search.
 *
 * Entries are views into the mapping, which may be misaligned for their
 * dtype (legal: the format does not pad).  dsq_st_tensor() gives a usable
 * view, copying on demand, so a checkpoint's unused tensors are never
 * copied however large they are.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "internal.h"
#include "json_strict.h"

/* The reference implementation's limit; real headers are well under 1 MB. */
#define ST_MAX_HEADER 100000000ull
/* Largest integer a double (cJSON's number type) holds exactly. */
#define ST_MAX_EXACT_INT 9007199254740992.0 /* 2^53 */

typedef struct st_file {
    char *path;
    const uint8_t *map; /* whole file, PROT_READ, MAP_PRIVATE */
    size_t size;
} st_file;

struct dsq_st_set {
    st_file *files;       /* [n_files] */
    int32_t n_files;
    int32_t cap_files;
    dsq_st_entry *entries; /* [n_entries], sorted by name once opened */
    int32_t n_entries;
    int32_t cap_entries;
    /* [n_entries] private heap copies made by dsq_st_tensor (misaligned
     * bytes, or a copy asked for); NULL where the mapping is used. */
    void **copies;
    uint64_t copied_bytes; /* total size of `copies` */
};

/* ---- dtypes ------------------------------------------------------------- */

typedef struct st_dtype_info {
    const char *name;
    uint32_t bits; /* per element; sub-byte types exist (F4, F6_*) */
    dsq_dtype dt;
} st_dtype_info;

static const st_dtype_info st_dtypes[] = {
    { "BOOL", 8, DSQ_DT_OTHER },     { "U8", 8, DSQ_DT_OTHER },
    { "I8", 8, DSQ_DT_OTHER },       { "F8_E5M2", 8, DSQ_DT_OTHER },
    { "F8_E4M3", 8, DSQ_DT_OTHER },  { "F8_E8M0", 8, DSQ_DT_OTHER },
    { "I16", 16, DSQ_DT_OTHER },     { "U16", 16, DSQ_DT_OTHER },
    { "F16", 16, DSQ_DT_F16 },       { "BF16", 16, DSQ_DT_BF16 },
    { "I32", 32, DSQ_DT_OTHER },     { "U32", 32, DSQ_DT_OTHER },
    { "F32", 32, DSQ_DT_F32 },       { "F64", 64, DSQ_DT_OTHER },
    { "I64", 64, DSQ_DT_OTHER },     { "U64", 64, DSQ_DT_OTHER },
    { "C64", 64, DSQ_DT_OTHER },     { "F4", 4, DSQ_DT_OTHER },
    { "F6_E2M3", 6, DSQ_DT_OTHER },  { "F6_E3M2", 6, DSQ_DT_OTHER },
};

static const st_dtype_info *st_dtype_lookup(const char *s)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(st_dtypes[i].name, s) == 0)
            return &st_dtypes[i];
    return NULL;
}

/* ---- header text checks ------------------------------------------------- */

/* Strict UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF).
 * Returns the offset of the first bad byte, or len if all is well. */
static size_t utf8_bad_offset(const uint8_t *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp, min;
        if (c >= 0xc2 && c <= 0xdf) {
            n = 1, cp = c & 0x1f, min = 0x80;
        } else if (c >= 0xe0 && c <= 0xef) {
            n = 2, cp = c & 0x0f, min = 0x800;
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return i;
        }
        if (len - i <= n)
            return i;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return i;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return i;
        i += n + 1;
    }
    return len;
}

/* Lexical checks cJSON does not make (it skips any byte <= 0x20 as
 * whitespace, keeps raw control characters in strings, and stores every
 * number as a double so "2.0" and "2" look alike).  Returns NULL if the text
 * is fine, else a description of the problem with its offset in *at.
 * *float_at gets the offset of the first number written with a fraction or
 * exponent (or len if none): reported only after the per-tensor checks, which
 * give a better message for values that are not integers at all. */
static const char *json_lex_problem(const uint8_t *s, size_t len, size_t *at, size_t *float_at)
{
    *float_at = len;
    int in_str = 0, esc = 0, in_num = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = s[i];
        *at = i;
        if (in_str) {
            if (esc)
                esc = 0;
            else if (c == '\\')
                esc = 1;
            else if (c == '"')
                in_str = 0;
            else if (c < 0x20)
                return "raw control character inside a string";
            continue;
        }
        if (in_num) {
            if ((c == '.' || c == 'e' || c == 'E') && *float_at == len)
                *float_at = i;
            if (c == '.' || c == 'e' || c == 'E' || (c >= '0' && c <= '9') || c == '-' || c == '+')
                continue;
            in_num = 0;
        }
        if (c == '"') {
            in_str = 1;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            in_num = 1;
            size_t d = (c == '-') ? i + 1 : i;
            if (d + 1 < len && s[d] == '0' && s[d + 1] >= '0' && s[d + 1] <= '9')
                return "number with a leading zero";
        } else if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
            return "control character outside a string";
        }
    }
    return NULL;
}

static int json_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Non-negative integer held exactly by a cJSON number. */
static int json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return 0;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > ST_MAX_EXACT_INT || floor(d) != d)
        return 0;
    *out = (uint64_t)d;
    return 1;
}

/* ---- set building ------------------------------------------------------- */

static dsq_status set_new(dsq_st_set **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? DSQ_OK : dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for a safetensors set");
}

static dsq_status set_add_file(dsq_st_set *set, const char *path, int32_t *idx)
{
    if (set->n_files == set->cap_files) {
        if (set->cap_files > INT32_MAX / 2)
            return dsq_fail(DSQ_ERR_FORMAT, "too many files");
        int32_t cap = set->cap_files ? set->cap_files * 2 : 4;
        st_file *nf = realloc(set->files, (size_t)cap * sizeof *nf);
        if (!nf)
            return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the file list");
        set->files = nf;
        set->cap_files = cap;
    }
    st_file *f = &set->files[set->n_files];
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for a path");
    *idx = set->n_files++;
    return DSQ_OK;
}

/* Map files[idx] read-only.  O_NONBLOCK so that a FIFO (or a device) in
 * place of a shard is refused by the fstat check below instead of blocking
 * open() until a writer appears; it changes nothing for a regular file. */
static dsq_status file_map(st_file *f)
{
    int fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return dsq_fail(DSQ_ERR_IO, "cannot open '%s': %s", f->path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return dsq_fail(DSQ_ERR_IO, "cannot stat '%s': %s", f->path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return dsq_fail(DSQ_ERR_IO, "'%s' is not a regular file", f->path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return dsq_fail(DSQ_ERR_FORMAT,
                        "'%s' is %lld bytes; a safetensors file starts with an 8-byte header length",
                        f->path, (long long)sb.st_size);
    }
    if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return dsq_fail(DSQ_ERR_IO, "'%s' is too large to map", f->path);
    }
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file alive */
    if (p == MAP_FAILED)
        return dsq_fail(DSQ_ERR_IO, "cannot mmap '%s' (%lld bytes): %s", f->path,
                        (long long)sb.st_size, strerror(e));
    f->map = p;
    f->size = (size_t)sb.st_size;
    return DSQ_OK;
}

static dsq_status entry_push(dsq_st_set *set, dsq_st_entry **e)
{
    if (set->n_entries == set->cap_entries) {
        if (set->cap_entries > INT32_MAX / 2)
            return dsq_fail(DSQ_ERR_FORMAT, "too many tensors");
        int32_t cap = set->cap_entries ? set->cap_entries * 2 : 64;
        dsq_st_entry *ne = realloc(set->entries, (size_t)cap * sizeof *ne);
        if (!ne)
            return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the tensor list");
        set->entries = ne;
        set->cap_entries = cap;
    }
    *e = &set->entries[set->n_entries++];
    memset(*e, 0, sizeof **e);
    return DSQ_OK;
}

/* Byte range of one tensor in a file's data section, for the tiling check. */
typedef struct st_range {
    uint64_t begin, end;
    const char *name;
} st_range;

static int range_cmp(const void *a, const void *b)
{
    const st_range *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

static int range_name_cmp(const void *a, const void *b)
{
    return strcmp(((const st_range *)a)->name, ((const st_range *)b)->name);
}

/* Validate one header entry and append it.  `data`/`data_len` is the file's
 * data section. */
static dsq_status parse_entry(dsq_st_set *set, int32_t file_idx, const cJSON *item,
                              const uint8_t *data, uint64_t data_len, st_range *range)
{
    const char *path = set->files[file_idx].path;
    const char *name = item->string;
    if (!cJSON_IsObject(item))
        return dsq_fail(DSQ_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", path, name);

    const cJSON *jd = NULL, *js = NULL, *jo = NULL;
    for (const cJSON *c = item->child; c; c = c->next) {
        const cJSON **slot = NULL;
        if (strcmp(c->string, "dtype") == 0)
            slot = &jd;
        else if (strcmp(c->string, "shape") == 0)
            slot = &js;
        else if (strcmp(c->string, "data_offsets") == 0)
            slot = &jo;
        else
            return dsq_fail(DSQ_ERR_FORMAT, "%s: tensor '%s': unknown field '%s'", path, name,
                            c->string);
        if (*slot)
            return dsq_fail(DSQ_ERR_FORMAT, "%s: tensor '%s': field '%s' appears twice", path,
                            name, c->string);
        *slot = c;
    }
    if (!jd)
        return dsq_fail(DSQ_ERR_FORMAT, "%s: tensor '%s': missing \"dtype\"", path, name);
    if (!js)
        return dsq_fail(DSQ_ERR_FORMAT, "%s: tensor '%s': missing \"shape\"", path, name);
    if (!jo)
        return dsq_fail(DSQ_ERR_FORMAT, "%s: tensor '%s': missing \"data_offsets\"", path, name);

    if (!cJSON_IsString(jd))
        return dsq_fail(DSQ_ERR_FORMAT, "%s: tensor '%s': \"dtype\" is not a string", path, name);
    const st_dtype_info *dti = st_dtype_lookup(jd->valuestring);
    if (!dti)
        return dsq_fail(DSQ_ERR_FORMAT, "%s: tensor '%s': unknown dtype \"%.32s\"", path, name,
                        jd->valuestring);

    if (!cJSON_IsArray(js))
        return dsq_fail(DSQ_ERR_FORMAT, "%s: tensor '%s': \"shape\" is not an array", path, name);
    int ndim = cJSON_GetArraySize(js);
    if (ndim > DSQ_MAX_DIMS)
        return dsq_fail(DSQ_ERR_FORMAT, "%s: tensor '%s': %d dimensions (at most %d supported)",
                        path, name, ndim, DSQ_MAX_DIMS);
    int64_t shape[DSQ_MAX_DIMS];
    int d = 0, any_zero = 0;
    for (const cJSON *c = js->child; c; c = c->next, d++) {
        uint64_t v;
        if (!json_uint(c, &v))
            return dsq_fail(DSQ_ERR_FORMAT,
                            "%s: tensor '%s': shape[%d] is not a non-negative integer", path, name, d);
        shape[d] = (int64_t)v;
        any_zero |= (v == 0);
    }
    uint64_t numel = any_zero ? 0 : 1;
    for (int k = 0; k < ndim && numel != 0; k++) {
        if (numel > UINT64_MAX / (uint64_t)shape[k])
            return dsq_fail(DSQ_ERR_FORMAT, "%s: tensor '%s': element count overflows", path, name);
        numel *= (uint64_t)shape[k];
    }

    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2)
        return dsq_fail(DSQ_ERR_FORMAT,
                        "%s: tensor '%s': \"data_offsets\" must be an array [begin, end]", path, name);
    uint64_t begin, end;
    if (!json_uint(jo->child, &begin) || !json_uint(jo->child->next, &end))
        return dsq_fail(DSQ_ERR_FORMAT,
                        "%s: tensor '%s': data_offsets are not non-negative integers", path, name);
    if (begin > end)
        return dsq_fail(DSQ_ERR_FORMAT, "%s: tensor '%s': data_offsets begin %llu > end %llu",
                        path, name, (unsigned long long)begin, (unsigned long long)end);
    if (end > data_len)
        return dsq_fail(DSQ_ERR_FORMAT,
                        "%s: tensor '%s': data_offsets end %llu is past the data section (%llu bytes)",
                        path, name, (unsigned long long)end, (unsigned long long)data_len);
    if (numel != 0 && numel > UINT64_MAX / dti->bits)
        return dsq_fail(DSQ_ERR_FORMAT, "%s: tensor '%s': byte size overflows", path, name);
    uint64_t bits = numel * dti->bits;
    if (bits % 8 != 0 || bits / 8 != end - begin)
        return dsq_fail(DSQ_ERR_FORMAT,
                        "%s: tensor '%s': shape x dtype %s is %llu bits but data_offsets span %llu bytes",
                        path, name, dti->name, (unsigned long long)bits,
                        (unsigned long long)(end - begin));

    dsq_st_entry *e = NULL;
    dsq_status st = entry_push(set, &e);
    if (st != DSQ_OK)
        return st;
    e->name = strdup(name);
    if (!e->name) {
        set->n_entries--;
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for a tensor name");
    }
    strcpy(e->dtype_str, dti->name); /* every known name fits in 8 bytes */
    e->file = file_idx;
    e->t.data = data + begin;
    e->t.dtype = dti->dt;
    e->t.ndim = ndim;
    for (int k = 0; k < ndim; k++)
        e->t.shape[k] = shape[k];
    e->t.nbytes = (size_t)(end - begin);
    range->begin = begin;
    range->end = end;
    range->name = e->name;
    return DSQ_OK;
}

static dsq_status check_metadata(const char *path, const cJSON *meta)
{
    if (!cJSON_IsObject(meta))
        return dsq_fail(DSQ_ERR_FORMAT, "%s: \"__metadata__\" is not a JSON object", path);
    for (const cJSON *c = meta->child; c; c = c->next)
        if (!cJSON_IsString(c))
            return dsq_fail(DSQ_ERR_FORMAT,
                            "%s: \"__metadata__\" value of '%s' is not a string", path, c->string);
    int oom = 0;
    const cJSON *dup = dsq_json_duplicate_key(meta, &oom);
    if (oom)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "%s: no memory to check \"__metadata__\"", path);
    if (dup)
        return dsq_fail(DSQ_ERR_FORMAT, "%s: \"__metadata__\" key '%s' appears twice", path,
                        dup->string);
    return DSQ_OK;
}

/* Parse and validate the header of files[idx] (already mapped), appending
 * its tensors to the set. */
static dsq_status parse_file(dsq_st_set *set, int32_t idx)
{
    const st_file *f = &set->files[idx];
    const char *path = f->path;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | f->map[i];
    if (hlen > ST_MAX_HEADER)
        return dsq_fail(DSQ_ERR_FORMAT, "%s: header length %llu exceeds the %llu-byte limit",
                        path, (unsigned long long)hlen, ST_MAX_HEADER);
    if (hlen > f->size - 8)
        return dsq_fail(DSQ_ERR_FORMAT,
                        "%s: header length %llu runs past the end of the file (%zu bytes)", path,
                        (unsigned long long)hlen, f->size);
    const uint8_t *h = f->map + 8;
    if (hlen == 0 || h[0] != '{')
        return dsq_fail(DSQ_ERR_FORMAT, "%s: header does not start with '{' (not a JSON object)",
                        path);
    size_t bad = utf8_bad_offset(h, (size_t)hlen);
    if (bad != hlen)
        return dsq_fail(DSQ_ERR_FORMAT, "%s: header is not valid UTF-8 (byte %zu)", path, bad);
    size_t at = 0, float_at = 0;
    const char *lex = json_lex_problem(h, (size_t)hlen, &at, &float_at);
    if (lex)
        return dsq_fail(DSQ_ERR_FORMAT, "%s: header JSON: %s (byte %zu)", path, lex, at);
    size_t nul = dsq_json_nul_offset((const char *)h, (size_t)hlen);
    if (nul != hlen)
        return dsq_fail(DSQ_ERR_FORMAT,
                        "%s: header JSON: a string holds NUL (\\u0000, byte %zu); names with NUL "
                        "would alias shorter names",
                        path, nul);

    /* Parse a NUL-terminated copy: the mapping may end right after the
     * header, and the parser must never be one bug away from reading past. */
    char *text = malloc((size_t)hlen + 1);
    if (!text)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "%s: no memory for a %llu-byte header", path,
                        (unsigned long long)hlen);
    memcpy(text, h, (size_t)hlen);
    text[hlen] = '\0';
    const char *end = NULL;
    errno = 0; /* cJSON returns NULL for bad text and failed allocations alike */
    cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)hlen, &end, 0);
    int parse_oom = !root && errno == ENOMEM;
    size_t end_off = root ? (size_t)(end - text) : 0;
    free(text);
    if (parse_oom)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "%s: no memory to parse the header", path);
    if (!root)
        return dsq_fail(DSQ_ERR_FORMAT, "%s: header is not valid JSON", path);
    for (size_t i = end_off; i < hlen; i++) {
        if (!json_ws(h[i])) {
            cJSON_Delete(root);
            return dsq_fail(DSQ_ERR_FORMAT, "%s: header has bytes after the JSON object (byte %zu)",
                            path, i);
        }
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dsq_fail(DSQ_ERR_FORMAT, "%s: header is not a JSON object", path);
    }

    const uint8_t *data = h + hlen;
    uint64_t data_len = f->size - 8 - hlen;
    int n_items = cJSON_GetArraySize(root);
    st_range *ranges = malloc((size_t)(n_items > 0 ? n_items : 1) * sizeof *ranges);
    if (!ranges) {
        cJSON_Delete(root);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for %d tensor ranges", n_items);
    }
    dsq_status st = DSQ_OK;
    int n_ranges = 0, n_meta = 0;
    for (const cJSON *c = root->child; c && st == DSQ_OK; c = c->next) {
        if (strcmp(c->string, "__metadata__") == 0) {
            if (n_meta++)
                st = dsq_fail(DSQ_ERR_FORMAT, "%s: \"__metadata__\" appears twice", path);
            else
                st = check_metadata(path, c);
        } else {
            st = parse_entry(set, idx, c, data, data_len, &ranges[n_ranges]);
            if (st == DSQ_OK)
                n_ranges++;
        }
    }

    /* The tensors must tile the data section: sorted by offset, each begins
     * where the previous ended, and the last ends at the end of the file. */
    /* Names first: a repeated entry would otherwise be reported as overlap. */
    if (st == DSQ_OK) {
        qsort(ranges, (size_t)n_ranges, sizeof *ranges, range_name_cmp);
        for (int i = 1; i < n_ranges && st == DSQ_OK; i++)
            if (strcmp(ranges[i - 1].name, ranges[i].name) == 0)
                st = dsq_fail(DSQ_ERR_FORMAT, "%s: duplicate tensor name '%s'", path,
                              ranges[i].name);
    }
    if (st == DSQ_OK) {
        qsort(ranges, (size_t)n_ranges, sizeof *ranges, range_cmp);
        uint64_t pos = 0;
        const char *prev = NULL;
        for (int i = 0; i < n_ranges && st == DSQ_OK; i++) {
            if (ranges[i].begin < pos)
                st = dsq_fail(DSQ_ERR_FORMAT,
                              "%s: tensor '%s' (bytes %llu..%llu) overlaps tensor '%s' (ends at %llu)",
                              path, ranges[i].name, (unsigned long long)ranges[i].begin,
                              (unsigned long long)ranges[i].end, prev, (unsigned long long)pos);
            else if (ranges[i].begin > pos)
                st = dsq_fail(DSQ_ERR_FORMAT,
                              "%s: hole in the data section: bytes %llu..%llu before tensor '%s' "
                              "belong to no tensor",
                              path, (unsigned long long)pos, (unsigned long long)ranges[i].begin,
                              ranges[i].name);
            pos = ranges[i].end;
            prev = ranges[i].name;
        }
        if (st == DSQ_OK && pos != data_len)
            st = dsq_fail(DSQ_ERR_FORMAT,
                          "%s: data section is %llu bytes but the tensors end at %llu "
                          "(trailing bytes belong to no tensor)",
                          path, (unsigned long long)data_len, (unsigned long long)pos);
    }
    if (st == DSQ_OK && float_at != hlen)
        st = dsq_fail(DSQ_ERR_FORMAT,
                      "%s: header number at byte %zu is not an integer literal "
                      "(shapes and offsets must be integers)",
                      path, float_at);
    free(ranges);
    cJSON_Delete(root);
    return st;
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const dsq_st_entry *)a)->name, ((const dsq_st_entry *)b)->name);
}

/* Sort by name, refuse duplicates. */
static dsq_status set_finish(dsq_st_set *set)
{
    if (set->n_entries > 1)
        qsort(set->entries, (size_t)set->n_entries, sizeof *set->entries, entry_cmp);
    for (int32_t i = 1; i < set->n_entries; i++) {
        const dsq_st_entry *a = &set->entries[i - 1], *b = &set->entries[i];
        if (strcmp(a->name, b->name) == 0) {
            if (a->file == b->file)
                return dsq_fail(DSQ_ERR_FORMAT, "%s: duplicate tensor name '%s'",
                                set->files[a->file].path, a->name);
            return dsq_fail(DSQ_ERR_FORMAT, "tensor '%s' appears in two shards: '%s' and '%s'",
                            a->name, set->files[a->file].path, set->files[b->file].path);
        }
    }
    set->copies = calloc((size_t)(set->n_entries > 0 ? set->n_entries : 1), sizeof *set->copies);
    if (!set->copies)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the tensor list");
    return DSQ_OK;
}

/* ---- public (internal) API ---------------------------------------------- */

void dsq_st_close(dsq_st_set *set)
{
    if (!set)
        return;
    for (int32_t i = 0; i < set->n_entries; i++) {
        free(set->entries[i].name);
        if (set->copies)
            free(set->copies[i]);
    }
    free(set->entries);
    free(set->copies);
    for (int32_t i = 0; i < set->n_files; i++) {
        if (set->files[i].map)
            munmap((void *)set->files[i].map, set->files[i].size);
        free(set->files[i].path);
    }
    free(set->files);
    free(set);
}

dsq_status dsq_st_open_file(const char *path, dsq_st_set **out)
{
    if (out)
        *out = NULL;
    if (!path || !out)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_st_open_file: NULL argument");
    dsq_st_set *set;
    dsq_status st = set_new(&set);
    if (st != DSQ_OK)
        return st;
    int32_t idx = 0;
    st = set_add_file(set, path, &idx);
    if (st == DSQ_OK)
        st = file_map(&set->files[idx]);
    if (st == DSQ_OK)
        st = parse_file(set, idx);
    if (st == DSQ_OK)
        st = set_finish(set);
    if (st != DSQ_OK) {
        dsq_st_close(set);
        return st;
    }
    *out = set;
    return DSQ_OK;
}

/* One weight_map entry of a sharded index. */
typedef struct st_wmap {
    const char *tensor; /* points into the cJSON tree */
    int32_t file;
} st_wmap;

static int wmap_cmp(const void *a, const void *b)
{
    return strcmp(((const st_wmap *)a)->tensor, ((const st_wmap *)b)->tensor);
}

/* A shard name and where the index mentions it (weight_map position). */
typedef struct st_shard_ref {
    const char *name;
    int pos;
} st_shard_ref;

static int shard_ref_cmp(const void *a, const void *b)
{
    const st_shard_ref *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c != 0)
        return c;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static int int_cmp(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* A shard must be a plain file name in the index's directory. */
static int shard_name_ok(const char *s)
{
    return s[0] != '\0' && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static dsq_status open_index(const char *dir, const char *index_path, dsq_st_set **out)
{
    char *text = NULL;
    size_t len = 0;
    dsq_status st = dsq_read_file(index_path, &text, &len);
    if (st != DSQ_OK)
        return st;
    size_t nul = dsq_json_nul_offset(text, len);
    if (nul != len) {
        free(text);
        return dsq_fail(DSQ_ERR_FORMAT,
                        "%s: a string holds NUL (raw or \\u0000, byte %zu); names with NUL would "
                        "alias shorter names",
                        index_path, nul);
    }
    const char *end = NULL;
    errno = 0; /* cJSON returns NULL for bad text and failed allocations alike */
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    int parse_oom = !root && errno == ENOMEM;
    st_wmap *wm = NULL;
    dsq_st_set *set = NULL;
    const char **shard_names = NULL; /* [n] shard of each weight_map member, into the cJSON tree */
    st_shard_ref *shard_refs = NULL; /* [n] */
    int *first_pos = NULL;           /* [n] */
    if (!root) {
        st = parse_oom ? dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "%s: no memory to parse", index_path)
                       : dsq_fail(DSQ_ERR_FORMAT, "%s: not valid JSON", index_path);
        goto done;
    }
    for (const char *p = end; p < text + len; p++)
        if (!json_ws((uint8_t)*p)) {
            st = dsq_fail(DSQ_ERR_FORMAT, "%s: bytes after the JSON object", index_path);
            goto done;
        }
    int oom = 0;
    const cJSON *dup = dsq_json_duplicate_key(root, &oom);
    if (oom || dup) {
        st = oom ? dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "%s: no memory to check keys", index_path)
                 : dsq_fail(DSQ_ERR_FORMAT, "%s: key '%s' appears twice in one object", index_path,
                            dup->string);
        goto done;
    }
    const cJSON *map = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(map)) {
        st = dsq_fail(DSQ_ERR_FORMAT, "%s: no \"weight_map\" object", index_path);
        goto done;
    }
    int n = cJSON_GetArraySize(map);
    if (n == 0) {
        st = dsq_fail(DSQ_ERR_FORMAT, "%s: \"weight_map\" is empty", index_path);
        goto done;
    }
    wm = malloc((size_t)n * sizeof *wm);
    shard_names = malloc((size_t)n * sizeof *shard_names);
    shard_refs = malloc((size_t)n * sizeof *shard_refs);
    first_pos = malloc((size_t)n * sizeof *first_pos);
    if (!wm || !shard_names || !shard_refs || !first_pos) {
        st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the weight map");
        goto done;
    }
    if ((st = set_new(&set)) != DSQ_OK)
        goto done;

    /* Distinct shards, in order of first mention; each opened once.  Found
     * by sorting (name, position) pairs: an index may name a shard per
     * tensor, and comparing each against every shard seen is quadratic. */
    int i = 0;
    for (const cJSON *c = map->child; c; c = c->next, i++) {
        if (!cJSON_IsString(c) || !shard_name_ok(c->valuestring)) {
            st = dsq_fail(DSQ_ERR_FORMAT,
                          "%s: weight_map[\"%s\"] is not a shard file name in the same directory",
                          index_path, c->string);
            goto done;
        }
        wm[i].tensor = c->string;
        wm[i].file = -1;
        shard_names[i] = c->valuestring;
        shard_refs[i].name = c->valuestring;
        shard_refs[i].pos = i;
    }
    qsort(shard_refs, (size_t)n, sizeof *shard_refs, shard_ref_cmp);
    /* first mentions, then those in file order get file indices 0, 1, ... */
    int n_first = 0;
    for (i = 0; i < n; i++)
        if (i == 0 || strcmp(shard_refs[i - 1].name, shard_refs[i].name) != 0)
            first_pos[n_first++] = shard_refs[i].pos;
    qsort(first_pos, (size_t)n_first, sizeof *first_pos, int_cmp);
    for (i = 0; i < n_first; i++) {
        char *shard_path = dsq_path_join(dir, shard_names[first_pos[i]]);
        int32_t f = -1;
        if (!shard_path) {
            st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for a path");
            goto done;
        }
        st = set_add_file(set, shard_path, &f);
        free(shard_path);
        if (st != DSQ_OK)
            goto done;
        wm[first_pos[i]].file = f;
    }
    /* every other mention takes the file of its name's first mention */
    int group = 0; /* shard_refs[group]: the first mention of the current name */
    for (i = 1; i < n; i++) {
        if (strcmp(shard_refs[group].name, shard_refs[i].name) != 0)
            group = i;
        else
            wm[shard_refs[i].pos].file = wm[shard_refs[group].pos].file;
    }
    qsort(wm, (size_t)n, sizeof *wm, wmap_cmp);
    for (i = 1; i < n; i++)
        if (strcmp(wm[i - 1].tensor, wm[i].tensor) == 0) {
            st = dsq_fail(DSQ_ERR_FORMAT, "%s: weight_map names tensor '%s' twice", index_path,
                          wm[i].tensor);
            goto done;
        }

    for (int32_t k = 0; k < set->n_files; k++) {
        st = file_map(&set->files[k]);
        if (st == DSQ_OK)
            st = parse_file(set, k);
        if (st != DSQ_OK) {
            if (st == DSQ_ERR_IO) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s", dsq_last_error_message());
                st = dsq_fail(st, "%s (shard named by %s)", msg, index_path);
            }
            goto done;
        }
    }
    st = set_finish(set);
    if (st != DSQ_OK)
        goto done;

    /* The index and the shards must agree exactly: both lists are sorted by
     * name, so walk them together. */
    int32_t j = 0;
    for (i = 0; i < n; i++) {
        while (j < set->n_entries && strcmp(set->entries[j].name, wm[i].tensor) < 0) {
            st = dsq_fail(DSQ_ERR_FORMAT, "%s holds tensor '%s' which %s does not list",
                          set->files[set->entries[j].file].path, set->entries[j].name, index_path);
            goto done;
        }
        if (j == set->n_entries || strcmp(set->entries[j].name, wm[i].tensor) != 0) {
            st = dsq_fail(DSQ_ERR_FORMAT, "%s: tensor '%s' is not in its shard '%s'", index_path,
                          wm[i].tensor, set->files[wm[i].file].path);
            goto done;
        }
        if (set->entries[j].file != wm[i].file) {
            st = dsq_fail(DSQ_ERR_FORMAT, "%s: tensor '%s' is listed in '%s' but found in '%s'",
                          index_path, wm[i].tensor, set->files[wm[i].file].path,
                          set->files[set->entries[j].file].path);
            goto done;
        }
        j++;
    }
    if (j < set->n_entries) {
        st = dsq_fail(DSQ_ERR_FORMAT, "%s holds tensor '%s' which %s does not list",
                      set->files[set->entries[j].file].path, set->entries[j].name, index_path);
        goto done;
    }

done:
    free(wm);
    free(shard_names);
    free(shard_refs);
    free(first_pos);
    cJSON_Delete(root);
    free(text);
    if (st != DSQ_OK) {
        dsq_st_close(set);
        set = NULL;
    }
    *out = set;
    return st;
}

dsq_status dsq_st_open_dir(const char *dir, dsq_st_set **out)
{
    if (out)
        *out = NULL;
    if (!dir || !out)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_st_open_dir: NULL argument");
    if (!dsq_is_dir(dir))
        return dsq_fail(DSQ_ERR_IO, "'%s' is not a directory", dir);
    char *single = dsq_path_join(dir, "model.safetensors");
    char *index = dsq_path_join(dir, "model.safetensors.index.json");
    dsq_status st;
    if (!single || !index)
        st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for paths");
    else if (dsq_path_exists(single)) /* not a regular file: refused by the open */
        st = dsq_st_open_file(single, out);
    else if (dsq_path_exists(index)) {
        st = open_index(dir, index, out);
    } else
        st = dsq_fail(DSQ_ERR_IO,
                      "'%s' holds neither model.safetensors nor model.safetensors.index.json", dir);
    free(single);
    free(index);
    return st;
}

const dsq_st_entry *dsq_st_find(const dsq_st_set *set, const char *name)
{
    if (!set || !name)
        return NULL;
    int32_t lo = 0, hi = set->n_entries - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        int c = strcmp(set->entries[mid].name, name);
        if (c == 0)
            return &set->entries[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

int32_t dsq_st_count(const dsq_st_set *set) { return set ? set->n_entries : 0; }

dsq_status dsq_st_tensor(dsq_st_set *set, const dsq_st_entry *e, int private_copy, dsq_tensor *out)
{
    if (!set || !e || !out || e < set->entries || e >= set->entries + set->n_entries)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_st_tensor: not an entry of this set");
    size_t i = (size_t)(e - set->entries);
    dsq_st_entry *me = &set->entries[i];
    size_t align = dsq_dtype_size(me->t.dtype); /* 0 for dtypes nobody reads */
    int misaligned = align != 0 && (uintptr_t)me->t.data % align != 0;
    if (!set->copies[i] && me->t.nbytes != 0 && (misaligned || private_copy)) {
        if (!me->t.data)
            return dsq_fail(DSQ_ERR_INTERNAL, "tensor '%s': its file is no longer mapped", me->name);
        /* Misaligned bytes are legal but rare (writers pad to 8): one copy
         * is cheaper than making every kernel cope with unaligned loads. */
        void *copy = malloc(me->t.nbytes);
        if (!copy)
            return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory to copy tensor '%s' (%zu bytes)",
                            me->name, me->t.nbytes);
        memcpy(copy, me->t.data, me->t.nbytes);
        set->copies[i] = copy;
        set->copied_bytes += me->t.nbytes;
        me->t.data = copy;
    }
    *out = me->t;
    return DSQ_OK;
}

uint64_t dsq_st_copied_bytes(const dsq_st_set *set) { return set ? set->copied_bytes : 0; }

void dsq_st_unmap(dsq_st_set *set)
{
    if (!set)
        return;
    for (int32_t i = 0; i < set->n_entries; i++)
        if (!set->copies || !set->copies[i])
            set->entries[i].t.data = NULL;
    for (int32_t i = 0; i < set->n_files; i++) {
        if (set->files[i].map)
            munmap((void *)set->files[i].map, set->files[i].size);
        set->files[i].map = NULL;
        set->files[i].size = 0;
    }
}

const dsq_st_entry *dsq_st_at(const dsq_st_set *set, int32_t i)
{
    if (!set || i < 0 || i >= set->n_entries)
        return NULL;
    return &set->entries[i];
}
