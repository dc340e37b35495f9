/* family.c — the family registry (family.h): the list of families and the look-ups every command uses. */
#include "family.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/weights.h"

static const dt_family *const families[] = {&dt_family_klein, &dt_family_krea2, &dt_family_zimage};
#define N_FAMILIES ((int)(sizeof families / sizeof families[0]))

const dt_family *const *dt_families(int *n) {
    *n = N_FAMILIES;
    return families;
}

int dt_family_name_in(const char *const *names, const char *s) {
    for (int i = 0; s && names && names[i]; i++)
        if (!strcmp(names[i], s)) return 1;
    return 0;
}

/* "A, B, C" of every family's names (which: 0 pipeline classes, 1 presets) */
static void list_names(int which, char *out, size_t n) {
    out[0] = 0;
    for (int f = 0; f < N_FAMILIES; f++) {
        const char *const *names = which ? families[f]->presets : families[f]->pipeline_classes;
        for (int i = 0; names && names[i]; i++) {
            size_t len = strlen(out);
            snprintf(out + len, n - len, "%s%s", len ? ", " : "", names[i]);
        }
    }
}

const dt_family *dt_family_for_pipeline(const char *cls, const char *what) {
    for (int f = 0; f < N_FAMILIES; f++)
        if (dt_family_name_in(families[f]->pipeline_classes, cls)) return families[f];
    char list[512];
    list_names(0, list, sizeof list);
    dt_set_error("%s: pipeline class '%s' is not supported (%s)", what, cls ? cls : "(none)", list);
    return NULL;
}

const dt_family *dt_family_for_config(const json *cfg) {
    const char *cls = cfg ? json_get_str(cfg, "_class_name") : NULL;
    for (int f = 0; f < N_FAMILIES; f++) {
        if (cls ? dt_family_name_in(families[f]->transformer_classes, cls)
                : cfg && families[f]->is_config && families[f]->is_config(cfg))
            return families[f];
    }
    return NULL;
}

const dt_family *dt_family_for_model(const char *path) {
    char *dir = dt_weights_component_dir(path, "transformer");
    if (!dir) return NULL;
    char cfgp[4200];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    free(dir);
    struct stat st;
    const dt_family *fam = NULL;
    if (stat(cfgp, &st) == 0) {
        json *j = json_parse_file(cfgp);   /* a FIFO or folder named config.json is refused, without waiting */
        if (!j) return NULL;
        fam = dt_family_for_config(j);
        json_free(j);
    }
    /* no config (the geometry is inferred from the tensors), or one no family claims: the infers_config family,
     * whose loader says what is missing or wrong */
    for (int f = 0; f < N_FAMILIES && !fam; f++)
        if (families[f]->infers_config) fam = families[f];
    return fam;
}

const dt_family *dt_family_for_preset(const char *preset) {
    for (int f = 0; f < N_FAMILIES; f++)
        if (dt_family_name_in(families[f]->presets, preset)) return families[f];
    char list[512];
    list_names(1, list, sizeof list);
    dt_set_error("unknown preset '%s' (%s)", preset ? preset : "(none)", list);
    return NULL;
}
