/* http.c - the HTTP side: libmicrohttpd in its internal thread mode, one
 * thread per connection.
 *
 * A connection thread reads the body (refusing it past --max-body), checks
 * the API key, parses and tokenizes the request (request.c) and submits it.
 * Then it only moves bytes: a streaming reply is a chunked response whose
 * reader callback copies what the scheduler appended to the request's `out`
 * buffer; a non-streaming reply waits for the finished body.  While waiting
 * it polls its own socket, so a client that disconnects is noticed within
 * ~100 ms and its request cancelled (the scheduler frees the sequence before
 * its next step).  The scheduler never waits for these threads. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "serve.h"

enum { ROUTE_NONE = 0, ROUTE_CHAT, ROUTE_CMPL };

/* Per connection-request state (MHD's con_cls). */
typedef struct conn {
    srv *s;
    int route;
    srv_buf body;
    int too_big;
    srv_req *req;     /* submitted; the HTTP side's reference               */
    int fd;
} conn;

static enum MHD_Result respond(struct MHD_Connection *c, unsigned status, char *body,
                               const char *type, int retry_after)
{
    if (!body)
        body = strdup("{}");
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", type ? type : "application/json");
    if (retry_after > 0) {
        char v[32];
        snprintf(v, sizeof v, "%d", retry_after);
        MHD_add_response_header(resp, "Retry-After", v);
    }
    enum MHD_Result ret = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result respond_error(struct MHD_Connection *c, unsigned status, const char *msg,
                                     const char *type, const char *code, int retry_after)
{
    return respond(c, status, srv_error_json(msg, type, NULL, code), NULL, retry_after);
}

/* The peer closed or reset its end. */
static int client_gone(int fd)
{
    if (fd < 0)
        return 0;
    struct pollfd p = { fd, POLLRDHUP, 0 };
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

/* Streaming: hand the scheduler's bytes to MHD; block (this connection's
 * thread only) while there are none. */
static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    conn *k = cls;
    srv *s = k->s;
    srv_req *r = k->req;
    ssize_t ret;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (r->out.len > 0) {
            size_t n = r->out.len < max ? r->out.len : max;
            memcpy(buf, r->out.p, n);
            memmove(r->out.p, r->out.p + n, r->out.len - n);
            r->out.len -= n;
            ret = (ssize_t)n;
            break;
        }
        if (r->finished) {
            ret = MHD_CONTENT_READER_END_OF_STREAM;
            break;
        }
        if (client_gone(k->fd)) {
            srv_req_cancel_locked(s, r);
            ret = MHD_CONTENT_READER_END_WITH_ERROR;
            break;
        }
        timed_wait(&r->cv, &s->mu, 100);
    }
    pthread_mutex_unlock(&s->mu);
    return ret;
}

static int authorized(srv *s, struct MHD_Connection *c)
{
    if (!s->o.api_key)
        return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0)
        return 0;
    h += 7;
    size_t a = strlen(h), b = strlen(s->o.api_key);
    unsigned diff = (unsigned)(a != b);
    for (size_t i = 0; i < a && i < b; i++) /* no early exit: constant time */
        diff |= (unsigned char)h[i] ^ (unsigned char)s->o.api_key[i];
    return diff == 0;
}

static enum MHD_Result get_route(srv *s, struct MHD_Connection *c, const char *url)
{
    if (!strcmp(url, "/health")) {
        pthread_mutex_lock(&s->mu);
        int stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        return respond(c, stopping ? 503 : 200,
                       strdup(stopping ? "{\"status\":\"stopping\"}" : "{\"status\":\"ok\"}"),
                       NULL, 0);
    }
    if (!strcmp(url, "/metrics")) {
        pthread_mutex_lock(&s->mu);
        char *t = srv_metrics_text(s);
        pthread_mutex_unlock(&s->mu);
        return respond(c, t ? 200 : 500, t, "text/plain; version=0.0.4", 0);
    }
    if (!strcmp(url, "/v1/models")) {
        if (!authorized(s, c))
            return respond_error(c, 401, "Incorrect API key provided.", "invalid_request_error",
                                 "invalid_api_key", 0);
        char *b = malloc(strlen(s->served_name) * 2 + 256);
        if (!b)
            return MHD_NO;
        /* served_name was checked to hold no character JSON would escape */
        sprintf(b,
                "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\",\"created\":%ld,"
                "\"owned_by\":\"dsqwen\",\"root\":\"%s\",\"max_model_len\":%d}]}",
                s->served_name, s->started, s->served_name, (int)s->max_context);
        return respond(c, 200, b, NULL, 0);
    }
    return respond_error(c, 404, "Not found.", "invalid_request_error", "not_found", 0);
}

static enum MHD_Result start_completion(srv *s, conn *k, struct MHD_Connection *c)
{
    if (k->too_big) {
        char m[128];
        snprintf(m, sizeof m, "the request body is larger than %zu bytes", s->o.max_body);
        return respond_error(c, 413, m, "invalid_request_error", "body_too_large", 0);
    }
    srv_req *r = NULL;
    char *err = NULL;
    int st = srv_parse_request(s, k->body.p ? k->body.p : "", k->body.len, k->route == ROUTE_CHAT,
                               &r, &err);
    srv_buf_free(&k->body);
    if (st != 0) {
        pthread_mutex_lock(&s->mu);
        s->m.requests_4xx += st < 500;
        s->m.requests_5xx += st >= 500;
        pthread_mutex_unlock(&s->mu);
        return respond(c, (unsigned)st, err, NULL, 0);
    }
    int stream = r->stream;
    st = srv_submit(s, r);
    if (st == 429) {
        srv_req_free(r);
        return respond_error(c, 429,
                             "The server is at capacity (KV cache and queue full); retry later.",
                             "rate_limit_error", "server_busy", s->o.retry_after);
    }
    if (st != 0) {
        srv_req_free(r);
        pthread_mutex_lock(&s->mu);
        s->m.requests_4xx += st < 500;
        s->m.requests_5xx += st >= 500;
        pthread_mutex_unlock(&s->mu);
        if (st == 413)
            return respond_error(c, 400, "the prompt does not fit in the KV cache pool",
                                 "invalid_request_error", "context_length_exceeded", 0);
        return respond_error(c, 503, "the server is shutting down", "server_error", NULL, 0);
    }
    k->req = r; /* srv_submit counted it in n_http_reqs */
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    k->fd = ci ? ci->connect_fd : -1;

    if (stream) {
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_reader, k, NULL);
        if (!resp)
            return MHD_NO; /* the completed callback cancels the request */
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    /* non-streaming: wait for the whole reply, watching the socket */
    pthread_mutex_lock(&s->mu);
    while (!r->finished) {
        if (client_gone(k->fd)) {
            srv_req_cancel_locked(s, r);
            pthread_mutex_unlock(&s->mu);
            return MHD_NO;
        }
        timed_wait(&r->cv, &s->mu, 100);
    }
    char *body = r->out.p;
    int status = r->http_status ? r->http_status : 500;
    r->out.p = NULL;
    r->out.len = r->out.cap = 0;
    srv_req_release_locked(s, r);
    k->req = NULL;
    s->n_http_reqs--;
    pthread_mutex_unlock(&s->mu);
    return respond(c, (unsigned)status, body, NULL, 0);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls)
{
    (void)version;
    srv *s = cls;
    conn *k = *con_cls;
    if (!k) {
        int post = !strcmp(method, "POST");
        int route = !strcmp(url, "/v1/chat/completions") ? ROUTE_CHAT
                  : !strcmp(url, "/v1/completions")      ? ROUTE_CMPL
                                                         : ROUTE_NONE;
        if (!route) {
            if (strcmp(method, "GET") && strcmp(method, "HEAD"))
                return respond_error(c, !strcmp(url, "/health") || !strcmp(url, "/metrics") ||
                                                !strcmp(url, "/v1/models")
                                            ? 405
                                            : 404,
                                     "Method or path not supported.", "invalid_request_error",
                                     "not_found", 0);
            /* answered on the next call, once MHD has the whole request:
             * a response queued on the first call makes MHD close the
             * connection (no keep-alive for /metrics scrapes, /health
             * probes, models.list; pipelined requests dropped) */
            if (!(k = calloc(1, sizeof *k)))
                return MHD_NO;
            k->s = s;
            k->route = ROUTE_NONE;
            k->fd = -1;
            *con_cls = k;
            return MHD_YES;
        }
        if (!post)
            return respond_error(c, 405, "Use POST.", "invalid_request_error",
                                 "method_not_allowed", 0);
        if (!authorized(s, c))
            return respond_error(c, 401, "Incorrect API key provided.", "invalid_request_error",
                                 "invalid_api_key", 0);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body) {
            char m[128];
            snprintf(m, sizeof m, "the request body is larger than %zu bytes", s->o.max_body);
            return respond_error(c, 413, m, "invalid_request_error", "body_too_large", 0);
        }
        if (!(k = calloc(1, sizeof *k)))
            return MHD_NO;
        k->s = s;
        k->route = route;
        k->fd = -1;
        *con_cls = k;
        return MHD_YES;
    }
    if (k->route == ROUTE_NONE) {
        if (*upload_size > 0) { /* a GET with a body: read and dropped */
            *upload_size = 0;
            return MHD_YES;
        }
        return get_route(s, c, url);
    }
    if (*upload_size > 0) {
        if (!k->too_big && k->body.len + *upload_size <= s->o.max_body) {
            if (srv_buf_add(&k->body, upload, *upload_size))
                return MHD_NO;
        } else {
            k->too_big = 1; /* read and drop the rest, then say 413 */
            srv_buf_free(&k->body);
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->req) /* already answered */
        return MHD_YES;
    return start_completion(s, k, c);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    (void)c;
    (void)toe;
    srv *s = cls;
    conn *k = *con_cls;
    if (!k)
        return;
    if (k->req) {
        pthread_mutex_lock(&s->mu);
        srv_req_cancel_locked(s, k->req); /* no-op when it finished */
        srv_req_release_locked(s, k->req);
        s->n_http_reqs--;
        pthread_mutex_unlock(&s->mu);
    }
    srv_buf_free(&k->body);
    free(k);
    *con_cls = NULL;
}

struct MHD_Daemon *srv_http_start(srv *s, int *port_out)
{
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    const struct sockaddr *sa;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;
    memset(&a4, 0, sizeof a4);
    memset(&a6, 0, sizeof a6);
    if (inet_pton(AF_INET, s->o.host, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)s->o.port);
        sa = (const struct sockaddr *)&a4;
    } else if (inet_pton(AF_INET6, s->o.host, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)s->o.port);
        sa = (const struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else {
        fprintf(stderr, "dsqwen serve: --host '%s' is not an IPv4 or IPv6 address\n", s->o.host);
        return NULL;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)s->o.port, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR, sa,
        MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)s->o.max_connections, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
        MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "dsqwen serve: cannot listen on %s port %d: %s\n", s->o.host, s->o.port,
                strerror(errno));
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port_out = di ? (int)di->port : s->o.port;
    return d;
}
