/* Replay driver without libFuzzer: runs every file named on the command line, or every
 * file of each directory named, through LLVMFuzzerTestOneInput once. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t* src, size_t size);

static int run_file(const char* path)
{
    FILE* f = fopen(path, "rb");
    long n;
    uint8_t* buf;
    if (!f) { fprintf(stderr, "cannot open %s\n", path); return 1; }
    if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) { fclose(f); return 1; }
    buf = (uint8_t*)malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); fclose(f); return 1; }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

int main(int argc, char** argv)
{
    int i, bad = 0, count = 0;
    for (i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st)) { fprintf(stderr, "cannot stat %s\n", argv[i]); bad++; continue; }
        if (S_ISDIR(st.st_mode)) {
            DIR* d = opendir(argv[i]);
            struct dirent* e;
            if (!d) { bad++; continue; }
            while ((e = readdir(d))) {
                char path[4096];
                struct stat fs;
                snprintf(path, sizeof(path), "%s/%s", argv[i], e->d_name);
                if (stat(path, &fs) || !S_ISREG(fs.st_mode)) continue;
                bad += run_file(path);
                count++;
            }
            closedir(d);
        } else {
            bad += run_file(argv[i]);
            count++;
        }
    }
    printf("replayed %d input(s), %d unreadable\n", count, bad);
    return bad != 0;
}
