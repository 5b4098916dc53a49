/* serve_main.h - the entry point of `dsqwen serve`, called by the dsqwen CLI
 * (examples/cli/main.c) when it is built with libmicrohttpd. */
#ifndef DSQ_SERVE_MAIN_H
#define DSQ_SERVE_MAIN_H

/* argv[0] is "serve"; returns the process exit code (0 after SIGINT/SIGTERM,
 * 1 runtime failure, 2 usage error).  Blocks SIGINT/SIGTERM in the calling
 * thread while it runs. */
int dsq_serve_main(int argc, char **argv);

#endif
