/* interact.c - Ctrl-C handling and line input for the dsqwen CLI. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef DSQ_CLI_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

#include "cli.h"

/* ---- Ctrl-C ------------------------------------------------------------------ */

static volatile sig_atomic_t g_in_reply;    /* a reply is being generated     */
static volatile sig_atomic_t g_interrupted; /* Ctrl-C arrived during it       */

static void on_sigint(int sig)
{
    (void)sig;
    if (g_in_reply && !g_interrupted) {
        g_interrupted = 1; /* cli_run_turn stops after the current token */
        return;
    }
    /* at a prompt, while loading, or a second Ctrl-C: leave now (libedit
     * has already restored the terminal when it forwards the signal) */
    static const char nl[] = "\n";
    ssize_t w = write(STDERR_FILENO, nl, 1);
    (void)w;
    _exit(CLI_EXIT_INTERRUPTED);
}

void cli_signals_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* output writes must not fail with EINTR */
    sigaction(SIGINT, &sa, NULL);
}

void cli_reply_begin(void)
{
    g_interrupted = 0;
    g_in_reply = 1;
}

int cli_reply_end(void)
{
    g_in_reply = 0;
    int was = g_interrupted;
    g_interrupted = 0;
    return was;
}

int cli_interrupted(void) { return g_interrupted != 0; }

/* ---- line input ------------------------------------------------------------------ */

static int g_edit; /* libedit in use */

int cli_input_has_libedit(void)
{
#ifdef DSQ_CLI_HAVE_LIBEDIT
    return 1;
#else
    return 0;
#endif
}

void cli_input_init(int interactive)
{
#ifdef DSQ_CLI_HAVE_LIBEDIT
    g_edit = interactive;
    if (g_edit)
        using_history();
#else
    (void)interactive;
    g_edit = 0;
#endif
}

char *cli_read_line(const char *prompt)
{
#ifdef DSQ_CLI_HAVE_LIBEDIT
    if (g_edit) {
        char *line = readline(prompt);
        if (line && line[0])
            add_history(line);
        return line;
    }
#endif
    if (prompt) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got = getline(&line, &cap, stdin);
    if (got < 0) {
        free(line);
        return NULL;
    }
    while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
        line[--got] = '\0';
    return line;
}

void cli_input_close(void)
{
#ifdef DSQ_CLI_HAVE_LIBEDIT
    if (g_edit)
        clear_history();
#endif
    g_edit = 0;
}
